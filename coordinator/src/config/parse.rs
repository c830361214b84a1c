//! Walks the spanned TOML tree, validating every key and collecting every
//! problem with its location.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lazaret_mounts::volumes::{PathProblem, Side, Volume, VolumeError, normalise_absolute};
use lazaret_netpolicy::Prefix;
use toml::Spanned;
use toml::de::{DeArray, DeTable, DeValue};

use super::diag::{ConfigError, Diagnostic, SourceMap, nearest};
use super::{
    AllowName, Config, DEFAULT_COMMAND, DEFAULT_ESCALATION_TIMEOUT, DEFAULT_PROMPT_TIMEOUT, DEFAULT_STORAGE_ROOT, ESCALATION_TIMEOUT_RANGE,
    EgressMode, EnvValue, EscalationOverrides, EscalationSettings, Located, NetworkSettings, OUTPUT_LIMIT_RANGE, PROMPT_TIMEOUT_RANGE,
    Platform, Profile, Rule, RunscSettings, SETUP_LIMITS, StateEntry, UserChoice, net,
};
use crate::escalation::rules::{HOST_COMMAND_PATH, RelativeDirProblem, refused_env, workspace_relative};

type Value<'i> = Spanned<DeValue<'i>>;

const TOP_KEYS: &[&str] = &["storage_root", "runtime_dir", "runsc", "dns", "escalation", "network", "default_profile", "profiles"];
const NETWORK_KEYS: &[&str] = &["pool", "pool6"];
const RUNSC_KEYS: &[&str] = &["path", "platform", "debug_log_dir"];
const ESCALATION_KEYS: &[&str] = &["prompt_timeout", "timeout", "output_limit", "rules"];
const RULE_KEYS: &[&str] = &["name", "command", "allow_extra_args", "cwd", "timeout", "env"];
const PROFILE_KEYS: &[&str] = &[
    "image",
    "command",
    "isolate_gitignored",
    "persistent_dirs",
    "allow_egress",
    "deny_egress",
    "egress",
    "ipv6",
    "dns",
    "env",
    "volumes",
    "profile_state",
    "user",
    "hostname",
    "memory_limit",
    "pids_limit",
    "escalation",
    "setup",
];

/// Parses `text` (the content of `file`) into a validated [`Config`].
pub(crate) fn parse(text: &str, file: &Path, home: &Path) -> Result<Config, ConfigError> {
    let map = SourceMap::new(file.display().to_string(), text);
    let (document, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        let diagnostics = syntax_errors
            .iter()
            .map(|error| {
                let span = error.span().unwrap_or(0..0);
                map.diagnostic(
                    &span,
                    format!("TOML syntax error: {}", error.message().trim_end()),
                    Some("see https://toml.io for the syntax; docs/config.example.toml shows every Lazaret key".to_string()),
                )
            })
            .collect();
        return Err(ConfigError::Invalid { diagnostics });
    }
    let mut walker = Walker { map, home, diagnostics: Vec::new(), origins: BTreeMap::new() };
    let config = walker.document(file, document.get_ref(), &document.span());
    let config = config.map(|mut config| {
        config.origins = std::mem::take(&mut walker.origins);
        config
    });
    let mut diagnostics = walker.diagnostics;
    diagnostics.sort_by_key(|d| (d.line, d.column));
    match config {
        Some(config) if diagnostics.is_empty() => Ok(config),
        _ => Err(ConfigError::Invalid { diagnostics }),
    }
}

struct Walker<'a> {
    map: SourceMap<'a>,
    home: &'a Path,
    diagnostics: Vec<Diagnostic>,
    /// `FILE:LINE:COLUMN` of the keys whose trust is checked later
    /// (see [`Config::origins`]).
    origins: BTreeMap<String, String>,
}

/// The known entries of one table, looked up by key.
struct Entries<'t, 'i> {
    table: &'t DeTable<'i>,
}

impl<'t, 'i> Entries<'t, 'i> {
    fn get(&self, key: &str) -> Option<&'t Value<'i>> {
        self.table.get(key)
    }
}

impl<'a> Walker<'a> {
    fn error(&mut self, span: &Range<usize>, message: impl Into<String>, hint: impl Into<String>) {
        let hint = hint.into();
        let hint = if hint.is_empty() { None } else { Some(hint) };
        let diagnostic = self.map.diagnostic(span, message, hint);
        self.diagnostics.push(diagnostic);
    }

    /// Reports an error at a location previously recorded as an origin.
    fn error_at_origin(&mut self, origin: &str, message: String, hint: &str) {
        let (line, column) = parse_origin_position(origin).unwrap_or((1, 1));
        self.diagnostics.push(Diagnostic { file: self.map.file().to_string(), line, column, message, hint: Some(hint.to_string()) });
    }

    /// Reports keys that are not in `allowed` and returns the table for
    /// lookups.
    fn entries<'t, 'i>(&mut self, table: &'t DeTable<'i>, allowed: &[&str], what: &str) -> Entries<'t, 'i> {
        for key in table.keys() {
            let name: &str = key.get_ref();
            if allowed.contains(&name) {
                continue;
            }
            let hint = match nearest(name, allowed) {
                Some(candidate) => format!("did you mean `{candidate}`? valid keys: {}", allowed.join(", ")),
                None => format!("valid keys: {}", allowed.join(", ")),
            };
            self.error(&key.span(), format!("unknown key `{name}` in {what}"), hint);
        }
        Entries { table }
    }

    fn type_error(&mut self, value: &Value<'_>, key: &str, expected: &str, example: &str) {
        let found = value.get_ref().type_str();
        self.error(&value.span(), format!("`{key}` must be {expected}, found {found}"), format!("for example: {key} = {example}"));
    }

    fn table<'t, 'i>(&mut self, value: &'t Value<'i>, key: &str, example: &str) -> Option<&'t DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(table) => Some(table),
            _ => {
                self.type_error(value, key, "a table", example);
                None
            }
        }
    }

    fn string<'t>(&mut self, value: &'t Value<'_>, key: &str, example: &str) -> Option<&'t str> {
        match value.get_ref() {
            DeValue::String(text) => {
                if text.contains('\0') {
                    self.error(&value.span(), format!("`{key}` contains a NUL character"), "");
                    return None;
                }
                Some(text)
            }
            _ => {
                self.type_error(value, key, "a string", example);
                None
            }
        }
    }

    fn boolean(&mut self, value: &Value<'_>, key: &str) -> Option<bool> {
        match value.get_ref() {
            DeValue::Boolean(flag) => Some(*flag),
            _ => {
                self.type_error(value, key, "true or false", "true");
                None
            }
        }
    }

    fn array<'t, 'i>(&mut self, value: &'t Value<'i>, key: &str, example: &str) -> Option<&'t DeArray<'i>> {
        match value.get_ref() {
            DeValue::Array(array) => Some(array),
            _ => {
                self.type_error(value, key, "an array", example);
                None
            }
        }
    }

    /// An array of strings; elements of the wrong type are reported and
    /// skipped.
    fn strings<'t>(&mut self, value: &'t Value<'_>, key: &str, example: &str) -> Option<Vec<(&'t str, Range<usize>)>> {
        let array = self.array(value, key, example)?;
        let mut out = Vec::new();
        for element in array.iter() {
            match element.get_ref() {
                DeValue::String(text) if !text.contains('\0') => out.push((&**text, element.span())),
                DeValue::String(_) => self.error(&element.span(), format!("an element of `{key}` contains a NUL character"), ""),
                other => {
                    let found = other.type_str();
                    self.error(
                        &element.span(),
                        format!("elements of `{key}` must be strings, found {found}"),
                        format!("for example: {key} = {example}"),
                    );
                }
            }
        }
        Some(out)
    }

    /// A positive integer, or a string such as "4G" when `sizes` is set.
    fn positive(&mut self, value: &Value<'_>, key: &str, sizes: bool) -> Option<u64> {
        let example = if sizes { "\"4G\"" } else { "4096" };
        match value.get_ref() {
            DeValue::Integer(integer) => {
                let parsed = i64::from_str_radix(&integer.as_str().replace('_', ""), integer.radix())
                    .ok()
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|n| *n > 0);
                if parsed.is_none() {
                    self.error(&value.span(), format!("`{key}` must be a positive integer"), format!("for example: {key} = {example}"));
                }
                parsed
            }
            DeValue::String(text) if sizes => {
                let parsed = parse_size(text);
                if parsed.is_none() {
                    self.error(
                        &value.span(),
                        format!("`{key}` = {text:?} is not a size"),
                        "write a number of bytes or a number followed by K, M, G or T (powers of 1024), e.g. \"512M\"",
                    );
                }
                parsed
            }
            _ => {
                let expected = if sizes { "a positive integer (bytes) or a size string" } else { "a positive integer" };
                self.type_error(value, key, expected, example);
                None
            }
        }
    }

    /// An absolute, normalised path without `..`, other than `/` itself.
    fn absolute_path(&mut self, text: &str, span: &Range<usize>, key: &str, example: &str) -> Option<PathBuf> {
        match normalise_absolute(text) {
            Ok(path) => Some(path),
            Err(problem) => {
                let (message, hint) = path_problem(problem, text, key, example);
                self.error(span, message, hint);
                None
            }
        }
    }

    fn path_value(&mut self, value: &Value<'_>, key: &str, example: &str) -> Option<PathBuf> {
        self.origins.insert(key.to_string(), self.map.origin(&value.span()));
        let text = self.string(value, key, &format!("\"{example}\""))?;
        self.absolute_path(text, &value.span(), key, example)
    }

    fn document(&mut self, file: &Path, root: &DeTable<'_>, root_span: &Range<usize>) -> Option<Config> {
        let top = self.entries(root, TOP_KEYS, "the top level");
        let storage_root = match top.get("storage_root") {
            Some(value) => self.path_value(value, "storage_root", DEFAULT_STORAGE_ROOT),
            None => Some(PathBuf::from(DEFAULT_STORAGE_ROOT)),
        };
        let runtime_dir = match top.get("runtime_dir") {
            Some(value) => self.path_value(value, "runtime_dir", "/run/lazaret/1000").map(Some),
            None => Some(None),
        };
        let runsc = match top.get("runsc") {
            Some(value) => self.runsc(value),
            None => Some(RunscSettings::default()),
        };
        let dns = match top.get("dns") {
            Some(value) => self.dns(value, "dns"),
            None => Some(Vec::new()),
        };
        let escalation = match top.get("escalation") {
            Some(value) => self.escalation(value, "escalation", &[]).map(|own| own.apply_to(&EscalationSettings::default())),
            None => Some(EscalationSettings::default()),
        };
        // Profiles add to the global escalation settings; when those are
        // invalid (already reported) the defaults stand in.
        let global_escalation = escalation.clone().unwrap_or_default();
        let network = match top.get("network") {
            Some(value) => self.network(value),
            None => Some(NetworkSettings::default()),
        };
        let default_profile =
            top.get("default_profile").map(|value| (self.string(value, "default_profile", "\"claude\"").map(str::to_string), value.span()));

        let mut profiles = BTreeMap::new();
        let mut profiles_ok = true;
        match top.get("profiles") {
            Some(value) => match self.table(value, "profiles", "{ shell = { image = \"debian-bookworm\" } }") {
                Some(table) => {
                    for (name, profile_value) in table.iter() {
                        match self.profile(name, profile_value, &global_escalation) {
                            Some(profile) => {
                                profiles.insert(profile.name.clone(), profile);
                            }
                            None => profiles_ok = false,
                        }
                    }
                    if table.is_empty() {
                        self.error(
                            &value.span(),
                            "`profiles` defines no profile",
                            "add a table such as [profiles.shell] with at least `image`",
                        );
                    }
                }
                None => profiles_ok = false,
            },
            None => self.error(
                &(root_span.start..root_span.start),
                "the configuration defines no profile",
                "add a table such as [profiles.shell] with at least `image = \"debian-bookworm\"`; see docs/config.example.toml",
            ),
        }

        let default_profile = match default_profile {
            None => None,
            Some((None, _)) => return None,
            Some((Some(name), span)) => {
                if profiles_ok && !profiles.contains_key(&name) {
                    let known: Vec<&str> = profiles.keys().map(String::as_str).collect();
                    let hint = match nearest(&name, &known) {
                        Some(candidate) => format!("did you mean {candidate:?}? defined profiles: {}", known.join(", ")),
                        None => format!("defined profiles: {}", known.join(", ")),
                    };
                    self.error(&span, format!("`default_profile` names {name:?}, which is not defined"), hint);
                }
                Some(name)
            }
        };

        Some(Config {
            file: file.to_path_buf(),
            storage_root: storage_root?,
            runtime_dir: runtime_dir?,
            runsc: runsc?,
            dns: dns?,
            escalation: escalation?,
            network: network?,
            default_profile,
            profiles,
            origins: BTreeMap::new(),
            file_owner: None,
        })
        .filter(|_| profiles_ok)
    }

    fn runsc(&mut self, value: &Value<'_>) -> Option<RunscSettings> {
        let table = self.table(value, "runsc", "{ platform = \"systrap\" }")?;
        let keys = self.entries(table, RUNSC_KEYS, "[runsc]");
        let mut ok = true;
        let path = match keys.get("path") {
            Some(value) => {
                let path = self.path_value(value, "runsc.path", "/usr/bin/runsc");
                ok &= path.is_some();
                path
            }
            None => None,
        };
        let debug_log_dir = match keys.get("debug_log_dir") {
            Some(value) => {
                let path = self.path_value(value, "runsc.debug_log_dir", "/var/log/lazaret/runsc");
                ok &= path.is_some();
                path
            }
            None => None,
        };
        let platform = match keys.get("platform") {
            None => Platform::Systrap,
            Some(value) => match self.string(value, "runsc.platform", "\"systrap\"") {
                Some(name) => match Platform::from_flag(name) {
                    Some(platform) => platform,
                    None => {
                        self.error(
                            &value.span(),
                            format!("unknown runsc platform {name:?}"),
                            "use \"systrap\" (default), \"ptrace\" or \"kvm\"",
                        );
                        return None;
                    }
                },
                None => return None,
            },
        };
        ok.then_some(RunscSettings { path, platform, debug_log_dir })
    }

    fn network(&mut self, value: &Value<'_>) -> Option<NetworkSettings> {
        let table = self.table(value, "network", "{ pool = \"100.96.0.0/16\" }")?;
        let keys = self.entries(table, NETWORK_KEYS, "[network]");
        let pool = keys.get("pool").map(|v| self.pool(v, "network.pool", true, 30, "\"100.96.0.0/16\""));
        let pool6 = keys.get("pool6").map(|v| self.pool(v, "network.pool6", false, 96, "\"fd6c:617a:6172::/96\""));
        Some(NetworkSettings { pool: pool.map_or(Some(None), |p| p.map(Some))?, pool6: pool6.map_or(Some(None), |p| p.map(Some))? })
    }

    /// An address pool: one prefix of the given family, `max_length` or shorter.
    fn pool(&mut self, value: &Value<'_>, key: &str, v4: bool, max_length: u8, example: &str) -> Option<Located<Prefix>> {
        let text = self.string(value, key, example)?;
        match text.parse::<Prefix>() {
            Ok(prefix) if prefix.is_v4() == v4 && prefix.prefix_len() <= max_length => {
                Some(Located::new(prefix, self.map.origin(&value.span())))
            }
            Ok(prefix) => {
                let family = if v4 { "IPv4" } else { "IPv6" };
                self.error(
                    &value.span(),
                    format!("`{key}` must be an {family} prefix of length /{max_length} or shorter, not {prefix}"),
                    format!("e.g. {key} = {example}"),
                );
                None
            }
            Err(error) => {
                let (message, hint) = net::describe(text, &error);
                self.error(&value.span(), format!("`{key}`: {message}"), hint);
                None
            }
        }
    }

    fn dns(&mut self, value: &Value<'_>, key: &str) -> Option<Vec<IpAddr>> {
        let example = "[\"1.1.1.1\", \"2606:4700:4700::1111\"]";
        let items = self.strings(value, key, example)?;
        let mut ok = items.len() == self.array(value, key, example).map_or(0, |a| a.len());
        let mut seen: Vec<(IpAddr, Range<usize>)> = Vec::new();
        for (text, span) in items {
            match text.parse::<IpAddr>() {
                Ok(address) => {
                    if let Some((_, first)) = seen.iter().find(|(a, _)| *a == address) {
                        let first = short_origin(&self.map.origin(first));
                        self.error(&span, format!("DNS server {address} is listed twice"), format!("remove one; the first is at {first}"));
                        ok = false;
                    } else {
                        seen.push((address, span));
                    }
                }
                Err(_) => {
                    self.error(
                        &span,
                        format!("{text:?} is not an IP address"),
                        "DNS servers are IPv4 or IPv6 addresses without port, e.g. \"1.1.1.1\"",
                    );
                    ok = false;
                }
            }
        }
        ok.then(|| seen.into_iter().map(|(a, _)| a).collect())
    }

    /// An `[escalation]` table: the global one (`prefix` = `escalation`) or a
    /// profile's (`profiles.NAME.escalation`). `taken` are the rules the
    /// table's rules join (the global ones for a profile): names must be
    /// unique among all of them.
    fn escalation(&mut self, value: &Value<'_>, prefix: &str, taken: &[Rule]) -> Option<EscalationOverrides> {
        let table = self.table(value, prefix, "{ timeout = 600, rules = [] }")?;
        let keys = self.entries(table, ESCALATION_KEYS, &format!("[{prefix}]"));
        let mut ok = true;
        let prompt_timeout =
            keys.get("prompt_timeout").map(|v| self.seconds(v, "prompt_timeout", PROMPT_TIMEOUT_RANGE, DEFAULT_PROMPT_TIMEOUT));
        let timeout = keys.get("timeout").map(|v| self.seconds(v, "timeout", ESCALATION_TIMEOUT_RANGE, DEFAULT_ESCALATION_TIMEOUT));
        let output_limit = keys.get("output_limit").map(|v| self.output_limit(v));
        let mut rules: Vec<Rule> = Vec::new();
        if let Some(rules_value) = keys.get("rules") {
            let example = "[{ name = \"git-fetch\", command = [\"git\", \"fetch\"] }]";
            match self.array(rules_value, &format!("{prefix}.rules"), example) {
                Some(array) => {
                    for element in array.iter() {
                        let Some(rule) = self.rule(element, prefix) else {
                            ok = false;
                            continue;
                        };
                        if let Some(first) = taken.iter().chain(&rules).find(|r| r.name == rule.name) {
                            let scope = if taken.is_empty() { "" } else { " among the global rules and the profile's" };
                            self.error(
                                &element.span(),
                                format!("escalation rule name {:?} is used twice", rule.name),
                                format!("rule names must be unique{scope}; the other is at {}", short_origin(&first.origin)),
                            );
                            ok = false;
                        } else {
                            rules.push(rule);
                        }
                    }
                }
                None => ok = false,
            }
        }
        let overrides = EscalationOverrides {
            rules,
            prompt_timeout: prompt_timeout.map_or(Some(None), |t| t.map(Some))?,
            timeout: timeout.map_or(Some(None), |t| t.map(Some))?,
            output_limit: output_limit.map_or(Some(None), |l| l.map(Some))?,
        };
        ok.then_some(overrides)
    }

    /// A whole number of seconds within `range`.
    fn seconds(&mut self, value: &Value<'_>, key: &str, range: RangeInclusive<u64>, default: Duration) -> Option<Duration> {
        let example = format!("{key} = {}", default.as_secs());
        let DeValue::Integer(integer) = value.get_ref() else {
            self.type_error(value, key, "a whole number of seconds", &default.as_secs().to_string());
            return None;
        };
        let parsed = i64::from_str_radix(&integer.as_str().replace('_', ""), integer.radix())
            .ok()
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| range.contains(n));
        if parsed.is_none() {
            self.error(
                &value.span(),
                format!("`{key}` must be between {} and {} seconds", range.start(), range.end()),
                format!("for example: {example} (the default)"),
            );
        }
        parsed.map(Duration::from_secs)
    }

    /// `output_limit`: bytes (or a size such as "64M") within [`OUTPUT_LIMIT_RANGE`].
    fn output_limit(&mut self, value: &Value<'_>) -> Option<u64> {
        let limit = self.positive(value, "output_limit", true)?;
        if OUTPUT_LIMIT_RANGE.contains(&limit) {
            Some(limit)
        } else {
            self.error(
                &value.span(),
                format!(
                    "`output_limit` must be between 1M ({}) and 1G ({}) bytes, found {limit}",
                    OUTPUT_LIMIT_RANGE.start(),
                    OUTPUT_LIMIT_RANGE.end()
                ),
                "for example: output_limit = \"64M\" (the default)",
            );
            None
        }
    }

    /// One `[[PREFIX.rules]]` entry.
    fn rule(&mut self, value: &Value<'_>, prefix: &str) -> Option<Rule> {
        let table = self.table(value, &format!("{prefix}.rules[..]"), "{ name = \"git-fetch\", command = [\"git\", \"fetch\"] }")?;
        let keys = self.entries(table, RULE_KEYS, &format!("an [[{prefix}.rules]] entry"));
        let origin = self.map.origin(&value.span());
        let name = match keys.get("name") {
            Some(v) => self.string(v, "name", "\"git-fetch\"").and_then(|name| {
                if valid_rule_name(name) {
                    Some(name.to_string())
                } else {
                    self.error(&v.span(), format!("rule name {name:?} is not valid"), RULE_NAME_HINT);
                    None
                }
            }),
            None => {
                self.error(&value.span(), "escalation rule has no `name`", "add e.g. name = \"git-fetch\"");
                None
            }
        };
        let command = match keys.get("command") {
            Some(v) => self.rule_command(v),
            None => {
                self.error(
                    &value.span(),
                    "escalation rule has no `command`",
                    "add the complete argument vector, e.g. command = [\"git\", \"fetch\"]",
                );
                None
            }
        };
        let allow_extra_args = match keys.get("allow_extra_args") {
            Some(v) => self.boolean(v, "allow_extra_args"),
            None => Some(false),
        };
        let cwd = match keys.get("cwd") {
            Some(v) => self.rule_cwd(v).map(Some),
            None => Some(None),
        };
        let timeout = match keys.get("timeout") {
            Some(v) => self.seconds(v, "timeout", ESCALATION_TIMEOUT_RANGE, DEFAULT_ESCALATION_TIMEOUT).map(Some),
            None => Some(None),
        };
        let env = match keys.get("env") {
            Some(v) => self.rule_env(v),
            None => Some(Vec::new()),
        };
        Some(Rule { name: name?, command: command?, allow_extra_args: allow_extra_args?, cwd: cwd?, timeout: timeout?, env: env?, origin })
    }

    /// A rule's `command`: a non-empty array of non-empty strings whose
    /// first element is a bare program name or an absolute path.
    fn rule_command(&mut self, value: &Value<'_>) -> Option<Vec<String>> {
        let example = "[\"git\", \"fetch\"]";
        let items = self.strings(value, "command", example)?;
        let total = self.array(value, "command", example).map_or(0, |a| a.len());
        if total == 0 {
            self.error(&value.span(), "`command` is empty", format!("give the program and its arguments, e.g. command = {example}"));
            return None;
        }
        let mut ok = items.len() == total;
        for (index, (text, span)) in items.iter().enumerate() {
            if text.is_empty() {
                let what = if index == 0 { "the program name" } else { "an argument" };
                self.error(
                    span,
                    format!("{what} in `command` is empty"),
                    format!("write every element as a non-empty string, e.g. command = {example}"),
                );
                ok = false;
            } else if index == 0 && text.contains('/') && !text.starts_with('/') {
                self.error(
                    span,
                    format!("the program {text:?} in `command` is a relative path"),
                    format!("it would be found relative to the working directory, inside the workspace the agent can write; use a bare name looked up on PATH={HOST_COMMAND_PATH} (e.g. \"make\") or an absolute path (e.g. \"/usr/bin/make\")"),
                );
                ok = false;
            }
        }
        ok.then(|| items.into_iter().map(|(s, _)| s.to_string()).collect())
    }

    /// A rule's `cwd`: a workspace-relative directory, normalised.
    fn rule_cwd(&mut self, value: &Value<'_>) -> Option<PathBuf> {
        let text = self.string(value, "cwd", "\".\"")?;
        match workspace_relative(text) {
            Ok(path) => Some(path),
            Err(problem) => {
                let hint = match problem {
                    RelativeDirProblem::Empty => "use \".\" for the workspace root or a directory below it, e.g. cwd = \"frontend\"",
                    RelativeDirProblem::Absolute => {
                        "`cwd` is relative to the workspace root, so the rule means the same in every workspace; e.g. cwd = \".\" or cwd = \"frontend\""
                    }
                    RelativeDirProblem::DotDot => {
                        "host commands run inside the workspace only; name a directory in it without `..`, e.g. cwd = \"frontend\""
                    }
                };
                let message = match problem {
                    RelativeDirProblem::Empty => "`cwd` is empty".to_string(),
                    _ => format!("`cwd`: {text:?} {problem}"),
                };
                self.error(&value.span(), message, hint);
                None
            }
        }
    }

    /// A rule's `env`: names of variables passed from the launching
    /// session, sorted (it is a set).
    fn rule_env(&mut self, value: &Value<'_>) -> Option<Vec<String>> {
        let example = "[\"GH_TOKEN\"]";
        let items = self.strings(value, "env", example)?;
        let mut ok = items.len() == self.array(value, "env", example).map_or(0, |a| a.len());
        let mut names: Vec<(&str, Range<usize>)> = Vec::new();
        for (name, span) in items {
            if !valid_env_name(name) {
                self.error(
                    &span,
                    format!("{name:?} is not a valid environment variable name"),
                    "use letters, digits and `_`, not starting with a digit, e.g. GH_TOKEN",
                );
                ok = false;
            } else if let Some(reason) = refused_env(name) {
                self.error(
                    &span,
                    format!("a rule may not pass {name}"),
                    format!("{reason}; see docs/escalation.md for the environment of host commands"),
                );
                ok = false;
            } else if let Some((_, first)) = names.iter().find(|(n, _)| *n == name) {
                let first = short_origin(&self.map.origin(first));
                self.error(&span, format!("{name} is listed twice in `env`"), format!("remove one; the first is at {first}"));
                ok = false;
            } else {
                names.push((name, span));
            }
        }
        let mut names: Vec<String> = names.into_iter().map(|(n, _)| n.to_string()).collect();
        names.sort();
        ok.then_some(names)
    }

    /// A non-empty array of non-empty strings.
    fn argv(&mut self, value: &Value<'_>, key: &str, example: &str) -> Option<Vec<String>> {
        let items = self.strings(value, key, example)?;
        let total = self.array(value, key, example).map_or(0, |a| a.len());
        if total == 0 {
            self.error(&value.span(), format!("`{key}` is empty"), format!("give the program and its arguments, e.g. {key} = {example}"));
            return None;
        }
        let mut ok = items.len() == total;
        if let Some((first, span)) = items.first()
            && first.is_empty()
        {
            self.error(span, format!("`{key}` starts with an empty program name"), format!("e.g. {key} = {example}"));
            ok = false;
        }
        ok.then(|| items.into_iter().map(|(s, _)| s.to_string()).collect())
    }

    fn profile(
        &mut self,
        name: &Spanned<std::borrow::Cow<'_, str>>,
        value: &Value<'_>,
        global_escalation: &EscalationSettings,
    ) -> Option<Profile> {
        let name_text: &str = name.get_ref();
        let mut ok = true;
        if !valid_name(name_text) {
            self.error(&name.span(), format!("profile name {name_text:?} is not valid"), NAME_HINT);
            ok = false;
        }
        let context = format!("[profiles.{name_text}]");
        let table = self.table(value, &format!("profiles.{name_text}"), "{ image = \"debian-bookworm\" }")?;
        let keys = self.entries(table, PROFILE_KEYS, &context);
        // A header `[profiles.x]` spans the header; point "missing key" errors there.
        let origin = self.map.origin(&value.span());

        let image = match keys.get("image") {
            Some(v) => self.string(v, "image", "\"debian-bookworm\"").and_then(|image| self.image(image, &v.span())),
            None => {
                self.error(&value.span(), format!("{context} has no `image`"), "add e.g. image = \"debian-bookworm\" (a name imported with `lazaret image import NAME`) or a registry reference such as \"docker.io/library/debian:trixie\"");
                None
            }
        };
        let command = match keys.get("command") {
            Some(v) => self.argv(v, "command", "[\"claude\"]"),
            None => Some(DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect()),
        };
        let isolate_gitignored = match keys.get("isolate_gitignored") {
            Some(v) => self.boolean(v, "isolate_gitignored"),
            None => Some(true),
        };
        let persistent_dirs = match keys.get("persistent_dirs") {
            Some(v) => self.persistent_dirs(v),
            None => Some(Vec::new()),
        };
        let ipv6 = match keys.get("ipv6") {
            Some(v) => self.boolean(v, "ipv6").map(Some),
            None => Some(None),
        };
        let egress = match keys.get("egress") {
            Some(v) => self.egress_mode(v),
            None => Some(EgressMode::Open),
        };
        let (allow, deny, egress_ok) = self.egress(keys.get("allow_egress"), keys.get("deny_egress"), ipv6);
        ok &= egress_ok;
        let (allow_names, names_ok) = match keys.get("allow_egress") {
            Some(v) => self.allow_names(v, egress),
            None => (Vec::new(), true),
        };
        ok &= names_ok;
        let (allow_egress, deny_egress) = (Some(allow), Some(deny));
        let dns = match keys.get("dns") {
            Some(v) => self.dns(v, "dns").map(Some),
            None => Some(None),
        };
        let env = match keys.get("env") {
            Some(v) => self.env(v),
            None => Some(BTreeMap::new()),
        };
        let volumes = match keys.get("volumes") {
            Some(v) => self.volumes(v),
            None => Some(Vec::new()),
        };
        let profile_state = match keys.get("profile_state") {
            Some(v) => self.profile_state(v),
            None => Some(Vec::new()),
        };
        if let Some(v) = keys.get("user") {
            self.origins.insert(format!("profiles.{name_text}.user"), self.map.origin(&v.span()));
        }
        let user = match keys.get("user") {
            Some(v) => self.user(v),
            None => Some(UserChoice::Developer),
        };
        let hostname = match keys.get("hostname") {
            Some(v) => self.hostname(v).map(Some),
            None => Some(None),
        };
        let memory_limit = match keys.get("memory_limit") {
            Some(v) => self.positive(v, "memory_limit", true).map(Some),
            None => Some(None),
        };
        let pids_limit = match keys.get("pids_limit") {
            Some(v) => self.positive(v, "pids_limit", false).map(Some),
            None => Some(None),
        };
        let escalation_overrides = match keys.get("escalation") {
            Some(v) => self.escalation(v, &format!("profiles.{name_text}.escalation"), &global_escalation.rules),
            None => Some(EscalationOverrides::default()),
        };
        let setup = match keys.get("setup") {
            Some(v) => self.setup(v, &context, persistent_dirs.as_ref().map(Vec::is_empty)),
            None => Some(Vec::new()),
        };
        if !ok {
            return None;
        }
        Some(Profile {
            name: name_text.to_string(),
            image: image?,
            command: command?,
            isolate_gitignored: isolate_gitignored?,
            persistent_dirs: persistent_dirs?,
            allow_egress: allow_egress?,
            deny_egress: deny_egress?,
            egress: egress?,
            allow_names,
            ipv6: ipv6?,
            dns: dns?,
            env: env?,
            volumes: volumes?,
            profile_state: profile_state?,
            user: user?,
            hostname: hostname?,
            memory_limit: memory_limit?,
            pids_limit: pids_limit?,
            escalation: escalation_overrides.as_ref()?.apply_to(global_escalation),
            escalation_overrides: escalation_overrides?,
            setup: setup?,
            origin,
        })
    }

    /// A profile's `setup`: steps run as root in the sandbox before the
    /// agent's first session (see `daemon::provision`), each a non-empty
    /// argv, within [`SETUP_LIMITS`]. `no_persistent_dirs` is whether the
    /// profile keeps nothing across runs (`None` when `persistent_dirs` was
    /// invalid): then the steps' results would be lost at every start.
    fn setup(&mut self, value: &Value<'_>, context: &str, no_persistent_dirs: Option<bool>) -> Option<Vec<Vec<String>>> {
        let example = "[[\"apt-get\", \"update\"], [\"apt-get\", \"install\", \"-y\", \"nodejs\", \"npm\"]]";
        let array = self.array(value, "setup", example)?;
        let mut ok = true;
        if array.len() > SETUP_LIMITS.steps {
            self.error(
                &value.span(),
                format!("`setup` of {context} has {} steps, more than {}", array.len(), SETUP_LIMITS.steps),
                "join steps with `sh -c \"a && b\"` or move them into a script installed by one step",
            );
            ok = false;
        }
        if no_persistent_dirs == Some(true) && !array.is_empty() {
            self.error(
                &value.span(),
                format!("`setup` of {context} needs `persistent_dirs`: only they keep what the steps install"),
                "keep the directories the steps write, e.g. persistent_dirs = [\"/usr\", \"/var\", \"/etc\", \"/opt\", \"/root\"]",
            );
            ok = false;
        }
        let mut steps = Vec::new();
        for (index, element) in array.iter().enumerate() {
            let number = index + 1;
            let DeValue::Array(args) = element.get_ref() else {
                let found = element.get_ref().type_str();
                self.error(
                    &element.span(),
                    format!("setup step {number} of {context} must be an argument vector (an array of strings), found {found}"),
                    format!(
                        "write each step as an array, e.g. setup = {example}; for a shell command line use [\"sh\", \"-c\", \"a && b\"]"
                    ),
                );
                ok = false;
                continue;
            };
            let mut argv = Vec::new();
            let mut step_ok = true;
            for arg in args.iter() {
                match arg.get_ref() {
                    DeValue::String(text) if text.contains('\0') => {
                        self.error(&arg.span(), format!("an argument of setup step {number} of {context} contains a NUL character"), "");
                        step_ok = false;
                    }
                    DeValue::String(text) => argv.push(text.to_string()),
                    other => {
                        let found = other.type_str();
                        self.error(
                            &arg.span(),
                            format!("arguments of setup step {number} of {context} must be strings, found {found}"),
                            format!("e.g. setup = {example}"),
                        );
                        step_ok = false;
                    }
                }
            }
            if !step_ok {
                ok = false;
                continue;
            }
            let bytes: usize = argv.iter().map(|a| a.len() + 1).sum();
            let problem = match argv.first() {
                None => Some((
                    format!("setup step {number} of {context} is empty"),
                    "give the program and its arguments, e.g. [\"apt-get\", \"update\"]".to_string(),
                )),
                Some(program) if program.is_empty() => Some((
                    format!("setup step {number} of {context} starts with an empty program name"),
                    "e.g. [\"apt-get\", \"update\"]".to_string(),
                )),
                Some(_) if argv.len() > SETUP_LIMITS.args => Some((
                    format!("setup step {number} of {context} has {} arguments, more than {}", argv.len(), SETUP_LIMITS.args),
                    "split it into several steps".to_string(),
                )),
                Some(_) if bytes > SETUP_LIMITS.step_bytes => Some((
                    format!("setup step {number} of {context} is {bytes} bytes long, more than {}", SETUP_LIMITS.step_bytes),
                    "install a script with one step and run it with the next".to_string(),
                )),
                Some(_) => None,
            };
            match problem {
                Some((message, hint)) => {
                    self.error(&element.span(), message, hint);
                    ok = false;
                }
                None => steps.push(argv),
            }
        }
        ok.then_some(steps)
    }

    /// `allow_egress` and `deny_egress` with their conflicts: an equal
    /// prefix both allowed and denied, and IPv6 prefixes with `ipv6 =
    /// false`. Conflicts are checked on the valid elements even when a list
    /// also has bad ones, so one run reports both kinds of mistakes.
    /// Returns both lists and whether all of it was valid.
    fn egress(
        &mut self,
        allow: Option<&Value<'_>>,
        deny: Option<&Value<'_>>,
        ipv6: Option<Option<bool>>,
    ) -> (Vec<Located<Prefix>>, Vec<Located<Prefix>>, bool) {
        let (allow, allow_ok) = match allow {
            Some(v) => self.prefixes(v, "allow_egress"),
            None => (Vec::new(), true),
        };
        let (deny, deny_ok) = match deny {
            Some(v) => self.prefixes(v, "deny_egress"),
            None => (Vec::new(), true),
        };
        let mut ok = allow_ok && deny_ok;
        for denied in &deny {
            if let Some(allowed) = allow.iter().find(|a| *a == denied) {
                let message = format!(
                    "{denied} is both allowed (allow_egress at {}) and denied (deny_egress at {})",
                    short_origin(&allowed.origin),
                    short_origin(&denied.origin)
                );
                self.error_at_origin(
                    &denied.origin,
                    message,
                    "an equal prefix cannot be both allowed and denied; remove one of the two entries",
                );
                ok = false;
            }
        }
        if ipv6 == Some(Some(false)) {
            for prefix in allow.iter().chain(&deny).filter(|p| !p.is_v4()) {
                let message = format!("IPv6 prefix {prefix} given while `ipv6 = false`");
                self.error_at_origin(&prefix.origin, message, "remove the IPv6 prefix or set ipv6 = true");
                ok = false;
            }
        }
        (allow, deny, ok)
    }

    /// A profile's `egress`: "open" or "locked".
    fn egress_mode(&mut self, v: &Value<'_>) -> Option<EgressMode> {
        let text = self.string(v, "egress", "\"locked\"")?;
        match text {
            "open" => Some(EgressMode::Open),
            "locked" => Some(EgressMode::Locked),
            _ => {
                self.error(
                    &v.span(),
                    format!("`egress` = {text:?} is not valid"),
                    "use \"open\" (default: the public internet, private ranges denied) or \"locked\" (only what allow_egress names)",
                );
                None
            }
        }
    }

    /// The name entries of `allow_egress` (the prefixes are read by
    /// [`Self::prefixes`], which leaves names to this). Names need
    /// `egress = "locked"` (`egress` is `None` when it was invalid).
    fn allow_names(&mut self, value: &Value<'_>, egress: Option<EgressMode>) -> (Vec<Located<AllowName>>, bool) {
        let Some(items) = self.strings(value, "allow_egress", "[\"api.anthropic.com\"]") else {
            return (Vec::new(), true);
        };
        let mut ok = true;
        let mut names: Vec<Located<AllowName>> = Vec::new();
        for (text, span) in items {
            if !lazaret_netpolicy::names::looks_like_name(text) {
                continue;
            }
            match lazaret_netpolicy::parse_name_rule(text) {
                Ok((pattern, port)) => {
                    let name = Located::new(AllowName { pattern, port }, self.map.origin(&span));
                    if egress == Some(EgressMode::Open) {
                        self.error(&span, format!("`allow_egress`: {text:?} is a DNS name, but names are only allowed with egress = \"locked\""), "open mode already allows every public address; set egress = \"locked\" in the profile to allow only what allow_egress names, or write the destination as a prefix such as \"192.0.2.0/24\"");
                        ok = false;
                    } else if let Some(first) = names.iter().find(|n| **n == name) {
                        self.error(
                            &span,
                            format!("{name} is listed twice in `allow_egress`"),
                            format!("remove one; the first is at {}", short_origin(&first.origin)),
                        );
                        ok = false;
                    } else {
                        names.push(name);
                    }
                }
                Err(error) => {
                    self.error(&span, format!("`allow_egress`: {error}"), "write a name such as \"api.anthropic.com\", a wildcard such as \"*.npmjs.org\", either optionally with a port (\"github.com:22\"), or a prefix such as \"10.222.0.0/16\"");
                    ok = false;
                }
            }
        }
        (names, ok)
    }

    /// A profile's `user`.
    fn user(&mut self, v: &Value<'_>) -> Option<UserChoice> {
        let text = self.string(v, "user", "\"developer\"")?;
        let parsed = parse_user(text);
        if parsed.is_none() {
            self.error(
                &v.span(),
                format!("`user` = {text:?} is not valid"),
                "use \"developer\" (default: your uid/gid), \"root\" or numeric \"UID:GID\" such as \"1000:1000\"",
            );
        }
        parsed
    }

    /// A profile's `hostname`.
    fn hostname(&mut self, v: &Value<'_>) -> Option<String> {
        let text = self.string(v, "hostname", "\"lazaret\"")?;
        if valid_hostname(text) {
            Some(text.to_string())
        } else {
            self.error(&v.span(), format!("`hostname` = {text:?} is not a valid host name"), "use letters, digits and `-` in dot-separated labels of at most 63 characters, not starting or ending with `-`, e.g. \"agent-box\"");
            None
        }
    }

    fn image(&mut self, image: &str, span: &Range<usize>) -> Option<String> {
        let valid = !image.is_empty()
            && image.len() <= 255
            && !image.starts_with(['-', '.', '/', ':', '@'])
            && image.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@+".contains(c));
        if valid {
            Some(image.to_string())
        } else {
            self.error(span, format!("`image` = {image:?} is not an image name or reference"), "use a name imported with `lazaret image import NAME` (e.g. \"debian-bookworm\") or a registry reference (e.g. \"docker.io/library/debian:trixie\")");
            None
        }
    }

    fn persistent_dirs(&mut self, value: &Value<'_>) -> Option<Vec<PathBuf>> {
        let example = "[\"/root\", \"/usr\", \"/var\", \"/etc\", \"/opt\"]";
        let items = self.strings(value, "persistent_dirs", example)?;
        let mut ok = items.len() == self.array(value, "persistent_dirs", example).map_or(0, |a| a.len());
        let mut dirs: Vec<(PathBuf, Range<usize>)> = Vec::new();
        for (text, span) in items {
            let Some(path) = self.absolute_path(text, &span, "persistent_dirs", "\"/opt\"") else {
                ok = false;
                continue;
            };
            if let Some((first, first_span)) = dirs.iter().find(|(d, _)| path.starts_with(d) || d.starts_with(&path)) {
                let first_origin = short_origin(&self.map.origin(first_span));
                let message = if *first == path {
                    format!("persistent directory {} is listed twice", path.display())
                } else {
                    format!("persistent directories {} and {} overlap", first.display(), path.display())
                };
                self.error(&span, message, format!("keep only the outer directory; the other entry is at {first_origin}"));
                ok = false;
                continue;
            }
            dirs.push((path, span));
        }
        ok.then(|| dirs.into_iter().map(|(d, _)| d).collect())
    }

    /// The valid prefixes of a list, and whether every element was valid.
    fn prefixes(&mut self, value: &Value<'_>, key: &str) -> (Vec<Located<Prefix>>, bool) {
        let example = "[\"10.222.0.0/16\", \"fd00:1::/64\"]";
        let Some(items) = self.strings(value, key, example) else {
            return (Vec::new(), false);
        };
        let mut ok = items.len() == self.array(value, key, example).map_or(0, |a| a.len());
        let mut prefixes: Vec<Located<Prefix>> = Vec::new();
        for (text, span) in items {
            if key == "allow_egress" && lazaret_netpolicy::names::looks_like_name(text) {
                // A name: read by `allow_names`.
                continue;
            }
            if key == "deny_egress" && lazaret_netpolicy::names::looks_like_name(text) {
                self.error(&span, format!("`deny_egress`: {text:?} is a DNS name, but deny_egress takes prefixes only"), "names cannot be denied reliably (a name's addresses change and are shared); with egress = \"locked\" every name that allow_egress does not name is refused already");
                ok = false;
                continue;
            }
            match text.parse::<Prefix>() {
                Ok(prefix) => {
                    let prefix = Located::new(prefix, self.map.origin(&span));
                    if let Some(first) = prefixes.iter().find(|p| **p == prefix) {
                        self.error(
                            &span,
                            format!("{prefix} is listed twice in `{key}`"),
                            format!("remove one; the first is at {}", short_origin(&first.origin)),
                        );
                        ok = false;
                    } else {
                        prefixes.push(prefix);
                    }
                }
                Err(error) => {
                    let (message, hint) = net::describe(text, &error);
                    self.error(&span, format!("`{key}`: {message}"), hint);
                    ok = false;
                }
            }
        }
        (prefixes, ok)
    }

    fn env(&mut self, value: &Value<'_>) -> Option<BTreeMap<String, EnvValue>> {
        let table = self.table(value, "env", "{ ANTHROPIC_API_KEY = \"env:ANTHROPIC_API_KEY\" }")?;
        let mut ok = true;
        let mut env = BTreeMap::new();
        for (name, entry) in table.iter() {
            let name_text: &str = name.get_ref();
            if !valid_env_name(name_text) {
                self.error(
                    &name.span(),
                    format!("{name_text:?} is not a valid environment variable name"),
                    "use letters, digits and `_`, not starting with a digit, e.g. ANTHROPIC_API_KEY",
                );
                ok = false;
                continue;
            }
            let Some(text) = self.string(entry, &format!("env.{name_text}"), "\"env:NAME\" or \"literal value\"") else {
                ok = false;
                continue;
            };
            let parsed = match text.strip_prefix("env:") {
                Some(host_name) if valid_env_name(host_name) => EnvValue::FromHost(host_name.to_string()),
                Some(host_name) => {
                    self.error(
                        &entry.span(),
                        format!("{host_name:?} is not a valid environment variable name"),
                        format!("\"env:NAME\" takes NAME from the launching session's environment, e.g. \"env:{name_text}\""),
                    );
                    ok = false;
                    continue;
                }
                None => EnvValue::Literal(text.to_string()),
            };
            env.insert(name_text.to_string(), parsed);
        }
        ok.then_some(env)
    }

    /// A profile's `profile_state`: directories of the agent's home (`~/X`),
    /// none holding another. Where they land against the workspace,
    /// volumes and `persistent_dirs` is checked once the agent's home is
    /// known (`Context::resolve`).
    fn profile_state(&mut self, value: &Value<'_>) -> Option<Vec<Located<StateEntry>>> {
        use lazaret_mounts::profile_state::EntryError;
        let example = "[\"~/.claude\", \"~/.codex\"]";
        let items = self.strings(value, "profile_state", example)?;
        let mut ok = items.len() == self.array(value, "profile_state", example).map_or(0, |a| a.len());
        let mut entries: Vec<(Located<StateEntry>, Range<usize>)> = Vec::new();
        for (text, span) in items {
            let entry = match StateEntry::parse(text) {
                Ok(entry) => entry,
                Err(error) => {
                    let hint = match error {
                        EntryError::LooksLikeFile(_) => {
                            "name the directory that holds it: a single file is replaced by rename, which a bound file does not survive; for Claude Code keep \"~/.claude\" and set env CLAUDE_CONFIG_DIR to that directory (then its .claude.json lives there)"
                        }
                        _ => "write a directory of the agent's home as ~/PATH, e.g. \"~/.claude\"",
                    };
                    self.error(&span, format!("`profile_state`: {error}"), hint);
                    ok = false;
                    continue;
                }
            };
            if let Some((first, first_span)) = entries.iter().find(|(e, _)| e.overlaps(&entry)) {
                let first_origin = short_origin(&self.map.origin(first_span));
                let message = if first.value == entry {
                    format!("profile state {entry} is listed twice")
                } else {
                    format!("profile state entries {} and {entry} overlap", first.value)
                };
                self.error(&span, message, format!("keep only the outer directory; the other entry is at {first_origin}"));
                ok = false;
                continue;
            }
            entries.push((Located::new(entry, self.map.origin(&span)), span));
        }
        ok.then(|| entries.into_iter().map(|(e, _)| e).collect())
    }

    fn volumes(&mut self, value: &Value<'_>) -> Option<Vec<Located<Volume>>> {
        let example = "[\"~/.claude:~/.claude\", \"/srv/data:/data:ro\"]";
        let items = self.strings(value, "volumes", example)?;
        let mut ok = items.len() == self.array(value, "volumes", example).map_or(0, |a| a.len());
        let mut volumes: Vec<Located<Volume>> = Vec::new();
        for (text, span) in items {
            match self.volume(text, &span) {
                Some(volume) => {
                    // As written: `~/x` and `/home/NAME/x` can meet only once
                    // the agent's home is known (`Context::resolve` checks).
                    if let Some(first) = volumes.iter().find(|v| v.sandbox == volume.sandbox) {
                        self.error(
                            &span,
                            format!("sandbox path {} is the target of two volumes", volume.sandbox),
                            format!("the other volume is at {}", short_origin(&first.origin)),
                        );
                        ok = false;
                    } else {
                        volumes.push(volume);
                    }
                }
                None => ok = false,
            }
        }
        ok.then_some(volumes)
    }

    fn volume(&mut self, text: &str, span: &Range<usize>) -> Option<Located<Volume>> {
        const HINT: &str = "write \"HOST:SANDBOX\" or \"HOST:SANDBOX:ro\", HOST absolute or starting with ~/ (your home), SANDBOX absolute or starting with ~/ (the agent's home inside the sandbox), e.g. \"~/.claude:~/.claude\"";
        let error = match Volume::parse(text, self.home) {
            Ok(volume) => return Some(Located::new(volume, self.map.origin(span))),
            Err(error) => error,
        };
        let (message, hint) = match &error {
            VolumeError::UnknownOption { .. } => (
                error.to_string(),
                "the only options are `ro` (read-only) and `rw` (default)".to_string(),
            ),
            VolumeError::NotHostSandbox { .. } | VolumeError::HomeDotDot { .. } => (error.to_string(), HINT.to_string()),
            VolumeError::OtherHome { side: Side::Host, .. } => (
                error.to_string(),
                "write the path in full (e.g. \"/home/bob/data:/data:ro\"), or ~/... for your own home".to_string(),
            ),
            VolumeError::OtherHome { side: Side::Sandbox, .. } => (
                error.to_string(),
                "~/ on the sandbox side is the home of the agent the profile runs (/home/<your name>, or /root for `user = \"root\"`); write another user's path in full, e.g. \"~/.claude:/home/bob/.claude\"".to_string(),
            ),
            VolumeError::Path { side: Side::Sandbox, path, problem: PathProblem::Relative, .. } => (
                format!("`volumes (sandbox side)`: {path:?} is a relative path"),
                "use an absolute path, or ~/... for a path in the agent's home inside the sandbox, e.g. \"~/.claude:~/.claude\" or \"/srv/data:/data\"".to_string(),
            ),
            VolumeError::Path { side, from_home, path, problem, .. } => {
                let (key, example) = match (side, from_home) {
                    (Side::Host, true) => ("volumes (host side)", "\"~/.claude:~/.claude\""),
                    (Side::Host, false) => (
                        "volumes (host side)",
                        "\"/srv/data:/data\" or \"~/.claude:~/.claude\"",
                    ),
                    (Side::Sandbox, _) => ("volumes (sandbox side)", "\"~/.claude:~/.claude\" or \"/srv/data:/data\""),
                };
                path_problem(*problem, path, key, example)
            }
        };
        self.error(span, message, hint);
        None
    }
}

const RULE_NAME_HINT: &str = "rule names use letters, digits, `_`, `.` and `-`, at most 64 characters, e.g. \"git-fetch\"";

/// Escalation rule names (shown in prompts and the journal).
fn valid_rule_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

const NAME_HINT: &str = "names use letters, digits, `-` and `_`, start with a letter or digit, and have at most 32 characters";

/// Profile names: they end up in directory and kernel object names.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn parse_user(text: &str) -> Option<UserChoice> {
    match text {
        "developer" => Some(UserChoice::Developer),
        "root" => Some(UserChoice::Root),
        _ => {
            let (uid, gid) = text.split_once(':')?;
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if !digits(uid) || !digits(gid) {
                return None;
            }
            Some(UserChoice::Id { uid: uid.parse().ok()?, gid: gid.parse().ok()? })
        }
    }
}

fn parse_size(text: &str) -> Option<u64> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return None;
    }
    let shift = match unit {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        _ => return None,
    };
    number
        .parse::<u64>()
        .ok()?
        .checked_mul(1u64 << shift)
        // TOML integers are i64: keep every limit representable in `config show`.
        .filter(|n| *n > 0 && i64::try_from(*n).is_ok())
}

/// `line L column C` of an origin, for messages about the same file.
fn short_origin(origin: &str) -> String {
    match parse_origin_position(origin) {
        Some((line, column)) => format!("line {line} column {column}"),
        None => origin.to_string(),
    }
}

/// Recovers (line, column) from an `origin` string `FILE:LINE:COLUMN`.
fn parse_origin_position(origin: &str) -> Option<(usize, usize)> {
    let mut parts = origin.rsplitn(3, ':');
    let column = parts.next()?.parse().ok()?;
    let line = parts.next()?.parse().ok()?;
    Some((line, column))
}

/// The diagnostic (message, hint) for the path `text` of `key`.
fn path_problem(problem: PathProblem, text: &str, key: &str, example: &str) -> (String, String) {
    match problem {
        PathProblem::Relative => (format!("`{key}`: {text:?} is a relative path"), format!("use an absolute path, e.g. {example}")),
        PathProblem::DotDot => (format!("`{key}`: {text:?} contains `..`"), format!("write the path without `..`, e.g. {example}")),
        PathProblem::Empty => (format!("`{key}` is empty"), format!("use an absolute path, e.g. {example}")),
        PathProblem::Root => (format!("`{key}` may not be `/`"), format!("name a directory below `/`, e.g. {example}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("4GiB"), Some(4 << 30));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("4 G"), None);
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }

    #[test]
    fn users() {
        assert_eq!(parse_user("developer"), Some(UserChoice::Developer));
        assert_eq!(parse_user("root"), Some(UserChoice::Root));
        assert_eq!(parse_user("1000:100"), Some(UserChoice::Id { uid: 1000, gid: 100 }));
        assert_eq!(parse_user("1000"), None);
        assert_eq!(parse_user("bob:1"), None);
        assert_eq!(parse_user("-1:1"), None);
    }

    #[test]
    fn names() {
        assert!(valid_name("claude"));
        assert!(valid_name("my_agent-2"));
        assert!(!valid_name("-x"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(""));
        assert!(valid_rule_name("git.fetch-all_2"));
        assert!(valid_rule_name(&"a".repeat(64)));
        assert!(!valid_rule_name(&"a".repeat(65)));
        assert!(!valid_rule_name(""));
        assert!(!valid_rule_name("git push"));
        assert!(!valid_rule_name("gït"));
        assert!(valid_env_name("_X1"));
        assert!(!valid_env_name("1X"));
        assert!(!valid_env_name("A-B"));
        assert!(valid_hostname("agent-box.local"));
        assert!(!valid_hostname("-bad"));
        assert!(!valid_hostname("a..b"));
    }

    fn parse_profile(keys: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("[profiles.claude]\nimage = \"i\"\n{keys}"), Path::new("/c.toml"), Path::new("/home/alice"))
    }

    fn errors(keys: &str) -> String {
        match parse_profile(keys) {
            Ok(_) => panic!("accepted: {keys}"),
            Err(e) => e.to_string(),
        }
    }

    const DIRS: &str = "persistent_dirs = [\"/usr\"]\n";

    #[test]
    fn setup_steps_are_argument_vectors_in_order() {
        let config = parse_profile(&format!("{DIRS}setup = [[\"apt-get\", \"update\"], [\"sh\", \"-c\", \"\"]]\n")).expect("valid");
        let setup = &config.profiles["claude"].setup;
        assert_eq!(setup, &[vec!["apt-get".to_string(), "update".to_string()], vec!["sh".into(), "-c".into(), String::new()]]);
        assert!(config.render_toml().expect("toml").contains("setup = ["), "config show shows the steps");
        assert!(config.render_json().expect("json").contains("\"apt-get\""), "config show --json too");
        let none = parse_profile(DIRS).expect("valid");
        assert!(!none.render_toml().expect("toml").contains("setup"), "no setup, no key");
    }

    #[test]
    fn setup_errors_name_the_profile_and_the_step() {
        let text = errors(&format!("{DIRS}setup = [[\"apt-get\", \"update\"], []]\n"));
        assert!(text.contains("setup step 2 of [profiles.claude] is empty"), "{text}");
        assert!(text.contains("/c.toml:4:"), "{text}");
        let text = errors(&format!("{DIRS}setup = [\"apt-get update\"]\n"));
        assert!(
            text.contains("setup step 1 of [profiles.claude] must be an argument vector (an array of strings), found string"),
            "{text}"
        );
        assert!(text.contains("[\"sh\", \"-c\""), "the hint shows how to write a command line: {text}");
        let text = errors(&format!("{DIRS}setup = [[\"npm\", 1]]\n"));
        assert!(text.contains("arguments of setup step 1 of [profiles.claude] must be strings, found integer"), "{text}");
        let text = errors(&format!("{DIRS}setup = [[\"\", \"x\"]]\n"));
        assert!(text.contains("setup step 1 of [profiles.claude] starts with an empty program name"), "{text}");
        let text = errors(&format!("{DIRS}setup = \"apt-get update\"\n"));
        assert!(text.contains("`setup` must be an array, found string"), "{text}");
        let text = errors("setup = [[\"apt-get\", \"update\"]]\n");
        assert!(text.contains("`setup` of [profiles.claude] needs `persistent_dirs`"), "{text}");
    }

    #[test]
    fn setup_limits_hold() {
        let many = vec!["[\"true\"]"; SETUP_LIMITS.steps + 1].join(", ");
        let text = errors(&format!("{DIRS}setup = [{many}]\n"));
        assert!(text.contains(&format!("has {} steps, more than {}", SETUP_LIMITS.steps + 1, SETUP_LIMITS.steps)), "{text}");
        let fits = vec!["[\"true\"]"; SETUP_LIMITS.steps].join(", ");
        assert!(parse_profile(&format!("{DIRS}setup = [{fits}]\n")).is_ok());
        let args = vec!["\"a\""; SETUP_LIMITS.args + 1].join(", ");
        let text = errors(&format!("{DIRS}setup = [[{args}]]\n"));
        assert!(text.contains(&format!("setup step 1 of [profiles.claude] has {} arguments", SETUP_LIMITS.args + 1)), "{text}");
        let long = "x".repeat(SETUP_LIMITS.step_bytes);
        let text = errors(&format!("{DIRS}setup = [[\"sh\", \"-c\", \"{long}\"]]\n"));
        assert!(text.contains("bytes long, more than"), "{text}");
        let text = errors(&format!("{DIRS}setup = [[\"a\\u0000b\"]]\n"));
        assert!(text.contains("contains a NUL character"), "{text}");
    }

    #[test]
    fn locked_egress_takes_names_wildcards_and_ports() {
        let config = parse_profile(
            "egress = \"locked\"\nallow_egress = [\"API.anthropic.com\", \"*.npmjs.org\", \"github.com:22\", \"10.222.0.0/16\"]\n",
        )
        .expect("valid");
        let profile = &config.profiles["claude"];
        assert_eq!(profile.egress, EgressMode::Locked);
        let names: Vec<String> = profile.allow_names.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["api.anthropic.com", "*.npmjs.org", "github.com:22"]);
        assert!(profile.allow_names[2].origin.ends_with("c.toml:4:53"), "{}", profile.allow_names[2].origin);
        assert_eq!(profile.allow_egress.len(), 1);
        let toml = config.render_toml().expect("toml");
        assert!(toml.contains("egress = \"locked\"") && toml.contains("\"*.npmjs.org\""), "{toml}");
        assert_eq!(parse_profile("").expect("valid").profiles["claude"].egress, EgressMode::Open);
    }

    #[test]
    fn names_in_open_mode_and_bad_names_are_errors() {
        let message = errors("allow_egress = [\"api.anthropic.com\"]\n");
        assert!(message.contains("\"api.anthropic.com\" is a DNS name, but names are only allowed with egress = \"locked\""), "{message}");
        assert!(message.contains("set egress = \"locked\""), "{message}");
        let message = errors("egress = \"locked\"\nallow_egress = [\"*.com\", \"a.b:0\", \"x.org\", \"X.org.\"]\n");
        assert!(message.contains("would allow a whole top-level domain"), "{message}");
        assert!(message.contains("the port must be a number from 1 to 65535"), "{message}");
        assert!(message.contains("x.org is listed twice in `allow_egress`"), "{message}");
        assert!(errors("egress = \"closed\"\n").contains("`egress` = \"closed\" is not valid"));
        assert!(errors("deny_egress = [\"evil.com\"]\n").contains("deny_egress takes prefixes only"));
    }

    #[test]
    fn egress_is_part_of_the_fingerprint_only_when_locked() {
        let fp = |keys: &str| parse_profile(keys).expect("valid").fingerprint("claude").expect("fingerprint");
        assert_eq!(fp(""), fp("egress = \"open\"\n"));
        let locked = fp("egress = \"locked\"\n");
        assert_ne!(fp(""), locked);
        assert_ne!(locked, fp("egress = \"locked\"\nallow_egress = [\"a.example.org\"]\n"));
    }

    #[test]
    fn setup_is_part_of_the_fingerprint_only_when_set() {
        let fp = |keys: &str| parse_profile(keys).expect("valid").fingerprint("claude").expect("fingerprint");
        let without = fp(DIRS);
        assert_eq!(without, fp(&format!("{DIRS}setup = []\n")), "an empty setup changes nothing");
        let one = fp(&format!("{DIRS}setup = [[\"apt-get\", \"update\"]]\n"));
        assert_ne!(without, one);
        assert_ne!(one, fp(&format!("{DIRS}setup = [[\"apt-get\", \"update\"], [\"true\"]]\n")), "a changed list is another configuration");
        assert_ne!(one, fp(&format!("{DIRS}setup = [[\"apt-get update\"]]\n")), "argv boundaries count");
    }

    #[test]
    fn profile_state_is_a_set_of_home_directories() {
        let config = parse_profile("profile_state = [\"~/.codex\", \"~/.config//opencode/\"]\n").expect("valid");
        let state = &config.profiles["claude"].profile_state;
        let written: Vec<String> = state.iter().map(ToString::to_string).collect();
        assert_eq!(written, ["~/.codex", "~/.config/opencode"]);
        assert!(state[1].origin.ends_with("c.toml:3:30"), "{}", state[1].origin);
        let toml = config.render_toml().expect("toml");
        assert!(
            toml.contains("profile_state = [\"~/.codex\", \"~/.config/opencode\"]") || toml.contains("\"~/.config/opencode\""),
            "{toml}"
        );
        assert!(!parse_profile("").expect("valid").render_toml().expect("toml").contains("profile_state"), "not shown when unset");
        // Order does not matter, content does; an unset list keeps older fingerprints.
        let fp = |keys: &str| parse_profile(keys).expect("valid").fingerprint("claude").expect("fingerprint");
        assert_eq!(fp(""), fp("profile_state = []\n"));
        let two = fp("profile_state = [\"~/.a\", \"~/.b\"]\n");
        assert_eq!(two, fp("profile_state = [\"~/.b\", \"~/.a\"]\n"));
        assert_ne!(two, fp("profile_state = [\"~/.a\"]\n"));
        assert_ne!(fp(""), fp("profile_state = [\"~/.a\"]\n"));
    }

    #[test]
    fn profile_state_errors_name_the_place_and_the_fix() {
        let text = errors("profile_state = [\"/root/.claude\"]\n");
        assert!(text.contains("/c.toml:3:18: `profile_state`: \"/root/.claude\" is not in the agent's home: write it as ~/PATH"), "{text}");
        assert!(text.contains("hint: write a directory of the agent's home as ~/PATH"), "{text}");
        let text = errors("profile_state = [\"~/.claude.json\"]\n");
        assert!(text.contains("looks like a file; profile state entries are directories"), "{text}");
        assert!(text.contains("CLAUDE_CONFIG_DIR"), "{text}");
        assert!(errors("profile_state = [\"~/\"]\n").contains("names the agent's home itself"));
        assert!(errors("profile_state = [\"~/a/../..\"]\n").contains("contains `..`"));
        let text = errors("profile_state = [\"~/.config/opencode\", \"~/.config\"]\n");
        assert!(text.contains("3:40: profile state entries ~/.config/opencode and ~/.config overlap"), "{text}");
        assert!(text.contains("the other entry is at line 3 column 18"), "{text}");
        assert!(errors("profile_state = [\"~/.a\", \"~/./.a\"]\n").contains("profile state ~/.a is listed twice"));
        assert!(errors("profile_state = \"~/.a\"\n").contains("profile_state"));
        assert!(errors("profile_state = [1]\n").contains("profile_state"));
    }

    #[test]
    fn paths_are_normalised() {
        assert_eq!(normalise_absolute("/usr//local/./bin/").ok(), Some(PathBuf::from("/usr/local/bin")));
        assert!(matches!(normalise_absolute("usr"), Err(PathProblem::Relative)));
        assert!(matches!(normalise_absolute("/usr/../etc"), Err(PathProblem::DotDot)));
        assert_eq!(parse_origin_position("/a:b/c.toml:12:5"), Some((12, 5)));
    }
}
