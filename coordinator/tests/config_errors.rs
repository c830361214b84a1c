//! Invalid configurations: every problem is reported with FILE:LINE:COLUMN and
//! a hint.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use lazaret_coordinator::config::{Config, ConfigError, Diagnostic};

fn diagnostics(text: &str) -> Vec<Diagnostic> {
    match Config::parse(text, Path::new("cfg.toml"), Path::new("/home/dev")) {
        Ok(_) => panic!("accepted invalid configuration:\n{text}"),
        Err(ConfigError::Invalid { diagnostics }) => diagnostics,
        Err(other) => panic!("unexpected error kind: {other}"),
    }
}

/// Asserts exactly these (line, column, message fragment) diagnostics, in order.
fn expect(text: &str, expected: &[(usize, usize, &str)]) -> Vec<Diagnostic> {
    let found = diagnostics(text);
    let summary: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(found.len(), expected.len(), "diagnostics:\n{}", summary.join("\n"));
    for (diagnostic, (line, column, fragment)) in found.iter().zip(expected) {
        assert_eq!((diagnostic.line, diagnostic.column), (*line, *column), "{diagnostic}");
        assert!(diagnostic.message.contains(fragment), "expected {fragment:?} in {diagnostic}");
        assert!(diagnostic.hint.is_some(), "no hint: {diagnostic}");
        assert_eq!(diagnostic.file, "cfg.toml");
    }
    found
}

const PROFILE: &str = "[profiles.a]\nimage = \"i\"\n";

#[test]
fn fixture_with_many_mistakes_reports_all_of_them() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config/errors.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let found = expect(
        &text,
        &[
            (2, 16, "\"var/lib/lazaret\" is a relative path"),
            (3, 19, "\"not-an-ip\" is not an IP address"),
            (4, 1, "unknown key `colour` in the top level"),
            (7, 12, "unknown runsc platform \"firecracker\""),
            (9, 1, "[profiles.claude] has no `image`"),
            (10, 1, "unknown key `imgae` in [profiles.claude]"),
            (11, 29, "\"usr\" is a relative path"),
            (11, 36, "\"/usr/../etc\" contains `..`"),
            (11, 51, "may not be `/`"),
            (12, 17, "10.222.0.1/16 has host bits set"),
            (12, 48, "10.0.0.0/8 is listed twice in `allow_egress`"),
            (13, 16, "10.0.0.0/8 is both allowed (allow_egress at line 12 column 34) and denied (deny_egress at line 13 column 16)"),
            (13, 30, "IPv6 prefix fd00::/8 given while `ipv6 = false`"),
            (14, 9, "\"BAD-NAME\" is not a valid environment variable name"),
            (14, 34, "\"\" is not a valid environment variable name"),
            (15, 12, "`volumes (host side)`: \"relative\" is a relative path"),
            (15, 27, "`volumes (sandbox side)`: \"rel\" is a relative path"),
            (15, 39, "unknown option \"rx\""),
            (16, 8, "`user` = \"nobody\" is not valid"),
            (17, 22, "`isolate_gitignored` must be true or false, found string"),
            (18, 11, "`command` is empty"),
        ],
    );
    assert!(found[5].hint.as_deref().unwrap().contains("did you mean `image`?"));
    assert!(found[9].hint.as_deref().unwrap().contains("\"10.222.0.0/16\""));
    assert!(found[0].hint.as_deref().unwrap().contains("use an absolute path"));
}

#[test]
fn display_is_file_line_column_message_then_hint() {
    let error = Config::parse("colour = 1\n", Path::new("/etc/x.toml"), Path::new("/h")).unwrap_err();
    let text = error.to_string();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("/etc/x.toml:1:1: unknown key `colour` in the top level"));
    assert!(lines.next().unwrap().starts_with("  hint: valid keys: storage_root,"));
    assert_eq!(lines.next(), Some("/etc/x.toml:1:1: the configuration defines no profile"));
    assert!(text.ends_with("2 errors in configuration"), "{text}");
}

#[test]
fn syntax_errors_are_located() {
    // An unterminated string is reported where the line ends.
    expect("[profiles.a]\nimage = \"i\nuser = 3\n", &[(2, 11, "TOML syntax error")]);
    let found = diagnostics("[profiles.a]\nimage = \"i\"\nimage = \"j\"\n");
    assert_eq!(found[0].line, 3, "{}", found[0]);
    assert!(found[0].message.contains("TOML syntax error"));
}

#[test]
fn wrong_types_point_at_the_value() {
    expect("profiles = 3\n", &[(1, 12, "`profiles` must be a table, found integer")]);
    expect(
        &format!("storage_root = [\"/x\"]\n[runsc]\npath = 5\n{PROFILE}"),
        &[(1, 16, "`storage_root` must be a string, found array"), (3, 8, "`runsc.path` must be a string, found integer")],
    );
    expect(
        "[profiles.a]\nimage = \"i\"\ncommand = [\"ok\", 3]\npersistent_dirs = \"/root\"\nenv = { A = 1 }\n",
        &[
            (3, 18, "elements of `command` must be strings, found integer"),
            (4, 19, "`persistent_dirs` must be an array, found string"),
            (5, 13, "`env.A` must be a string, found integer"),
        ],
    );
    expect(
        "[profiles.a]\nimage = \"i\"\npids_limit = -1\nmemory_limit = \"4 GB\"\n",
        &[(3, 14, "positive integer"), (4, 16, "is not a size")],
    );
}

#[test]
fn prefix_conflicts_and_families() {
    let found = expect(
        "[profiles.a]\nimage = \"i\"\nallow_egress = [\"192.168.1.0/24\"]\ndeny_egress = [\"192.168.1.0/24\", \"10.0.0.1\"]\n",
        &[
            (4, 16, "192.168.1.0/24 is both allowed (allow_egress at line 3 column 17) and denied (deny_egress at line 4 column 16)"),
            (4, 34, "\"10.0.0.1\" has no prefix length"),
        ],
    );
    assert!(found[1].hint.as_deref().unwrap().contains("10.0.0.1/32"));
    expect(
        "[profiles.a]\nimage = \"i\"\nallow_egress = [\"fd00::1/8\", \"1.2.3.0/33\"]\n",
        &[(3, 17, "host bits set"), (3, 30, "not valid for IPv4")],
    );
    // More-specific allow inside a deny is fine (longest prefix wins).
    let config = Config::parse(
        "[profiles.a]\nimage = \"i\"\nallow_egress = [\"10.1.0.0/16\"]\ndeny_egress = [\"10.0.0.0/8\"]\n",
        Path::new("cfg.toml"),
        Path::new("/h"),
    );
    assert!(config.is_ok());
}

#[test]
fn paths_and_volumes() {
    expect(
        "[profiles.a]\nimage = \"i\"\npersistent_dirs = [\"/usr\", \"/usr/local\", \"/opt\", \"/opt/\"]\n",
        &[(3, 28, "persistent directories /usr and /usr/local overlap"), (3, 50, "persistent directory /opt is listed twice")],
    );
    expect(
        "[profiles.a]\nimage = \"i\"\nvolumes = [\"/a:/x\", \"/b:/x/\", \"~bob/x:/y\", \"/c\", \"~/../etc:/z\", \"/:/host\"]\n",
        &[
            (3, 21, "sandbox path /x is the target of two volumes"),
            (3, 31, "only ~/ (your home on the host) is supported"),
            (3, 44, "is not HOST:SANDBOX[:ro]"),
            (3, 50, "contains `..`"),
            (3, 65, "may not be `/`"),
        ],
    );
    expect(
        "runtime_dir = \"run/x\"\n[runsc]\ndebug_log_dir = \"/\"\n[profiles.a]\nimage = \"i\"\n",
        &[(1, 15, "relative path"), (3, 17, "may not be `/`")],
    );
}

/// `~/` on the sandbox side is the agent's home: `~user/`, `..` and a
/// relative path are refused with hints that name the `~/` form, and two
/// volumes written with the same `~/` path collide.
#[test]
fn sandbox_side_home_paths() {
    let found = expect(
        "[profiles.a]\nimage = \"i\"\nvolumes = [\"/a:~bob/x\", \"/b:~/../etc\", \"/c:rel\", \"/d:~/x\", \"/e:~/./x/\"]\n",
        &[
            (3, 12, "volume sandbox path \"~bob/x\": only ~/ (the agent's home inside the sandbox) is supported, not ~user/"),
            (3, 25, "volume sandbox path \"~/../etc\" contains `..`"),
            (3, 40, "`volumes (sandbox side)`: \"rel\" is a relative path"),
            (3, 60, "sandbox path ~/x is the target of two volumes"),
        ],
    );
    let hints: Vec<&str> = found.iter().map(|d| d.hint.as_deref().unwrap()).collect();
    assert!(
        hints[0].contains("the home of the agent the profile runs") && hints[0].contains("/root for `user = \"root\"`"),
        "{}",
        hints[0]
    );
    assert!(hints[1].contains("SANDBOX absolute or starting with ~/ (the agent's home inside the sandbox)"), "{}", hints[1]);
    assert!(hints[2].contains("~/... for a path in the agent's home inside the sandbox"), "{}", hints[2]);
    // Accepted: `~`, `~/...`, both sides.
    let config = Config::parse(
        "[profiles.a]\nimage = \"i\"\nvolumes = [\"~/.claude:~/.claude\", \"/srv/t:~:ro\"]\n",
        Path::new("cfg.toml"),
        Path::new("/home/dev"),
    )
    .unwrap();
    let written: Vec<String> = config.profiles["a"].volumes.iter().map(ToString::to_string).collect();
    assert_eq!(written, ["/home/dev/.claude:~/.claude", "/srv/t:~:ro"]);
}

#[test]
fn names_hosts_users_images() {
    expect(
        "[profiles.\"bad name\"]\nimage = \"i\"\n[profiles.b]\nimage = \"-x\"\nhostname = \"under_score\"\nuser = \"1000\"\n",
        &[
            (1, 11, "profile name \"bad name\" is not valid"),
            (4, 9, "is not an image name or reference"),
            (5, 12, "is not a valid host name"),
            (6, 8, "`user` = \"1000\" is not valid"),
        ],
    );
}

#[test]
fn escalation_rules() {
    let found = expect(
        &format!(
            "[[escalation.rules]]\nname = \"push\"\ncommand = [\"git\", \"push\"]\nallow_extra_arg = true\n\
             [[escalation.rules]]\nname = \"push\"\ncommand = [\"git\"]\n\
             [[escalation.rules]]\ncommand = []\ncwd = \"/srv\"\n{PROFILE}"
        ),
        &[
            (4, 1, "unknown key `allow_extra_arg` in an [[escalation.rules]] entry"),
            (5, 1, "escalation rule name \"push\" is used twice"),
            (8, 1, "escalation rule has no `name`"),
            (9, 11, "`command` is empty"),
            (10, 7, "\"/srv\" is an absolute path"),
        ],
    );
    assert!(found[0].hint.as_deref().unwrap().contains("did you mean `allow_extra_args`?"));
    assert!(found[1].hint.as_deref().unwrap().contains("line 1 column 1"));
    assert!(found[4].hint.as_deref().unwrap().contains("relative to the workspace root"));
    expect(&format!("escalation = {{ rule = [] }}\n{PROFILE}"), &[(1, 16, "unknown key `rule` in [escalation]")]);
}

#[test]
fn escalation_rule_values() {
    let found = expect(
        &format!(
            "[[escalation.rules]]\n\
             name = \"git push\"\n\
             command = [\"./build.sh\", \"\", 3]\n\
             allow_extra_args = \"yes\"\n\
             cwd = \"src/../..\"\n\
             timeout = 0\n\
             env = [\"LD_PRELOAD\", \"GIT_SSH_COMMAND\", \"PATH\", \"1X\", \"GH_TOKEN\", \"GH_TOKEN\"]\n\
             [[escalation.rules]]\n\
             name = \"x\"\n\
             command = [\"true\"]\n\
             cwd = \"\"\n\
             timeout = \"10m\"\n\
             env = \"GH_TOKEN\"\n\
             [[escalation.rules]]\n\
             name = \"{long}\"\n\
             command = [\"\"]\n\
             {PROFILE}",
            long = "a".repeat(65)
        ),
        &[
            (2, 8, "rule name \"git push\" is not valid"),
            (3, 12, "the program \"./build.sh\" in `command` is a relative path"),
            (3, 26, "an argument in `command` is empty"),
            (3, 30, "elements of `command` must be strings"),
            (4, 20, "`allow_extra_args` must be true or false"),
            (5, 7, "contains `..`"),
            (6, 11, "`timeout` must be between 1 and 86400 seconds"),
            (7, 8, "a rule may not pass LD_PRELOAD"),
            (7, 22, "a rule may not pass GIT_SSH_COMMAND"),
            (7, 41, "a rule may not pass PATH"),
            (7, 49, "\"1X\" is not a valid environment variable name"),
            (7, 67, "GH_TOKEN is listed twice in `env`"),
            (11, 7, "`cwd` is empty"),
            (12, 11, "`timeout` must be a whole number of seconds"),
            (13, 7, "`env` must be an array"),
            (15, 8, "is not valid"),
            (16, 12, "the program name in `command` is empty"),
        ],
    );
    assert!(found[1].hint.as_deref().unwrap().contains("inside the workspace the agent can write"), "{}", found[1]);
    assert!(found[7].hint.as_deref().unwrap().contains("dynamic loader"), "{}", found[7]);
    assert!(found[9].hint.as_deref().unwrap().contains("/usr/local/bin:/usr/bin:/bin"), "{}", found[9]);
    assert!(found[11].hint.as_deref().unwrap().contains("line 7 column 55"), "{}", found[11]);
}

#[test]
fn escalation_settings_are_bounded() {
    expect(
        &format!("[escalation]\nprompt_timeout = 3601\ntimeout = 86401\noutput_limit = 1048575\n{PROFILE}"),
        &[
            (2, 18, "`prompt_timeout` must be between 1 and 3600 seconds"),
            (3, 11, "`timeout` must be between 1 and 86400 seconds"),
            (4, 16, "`output_limit` must be between 1M (1048576) and 1G (1073741824) bytes"),
        ],
    );
    expect(
        &format!("[escalation]\nprompt_timeout = -1\noutput_limit = \"2G\"\nrules = {{}}\n{PROFILE}"),
        &[
            (2, 18, "`prompt_timeout` must be between 1 and 3600 seconds"),
            (3, 16, "`output_limit` must be between"),
            (4, 9, "`escalation.rules` must be an array"),
        ],
    );
    // The bounds themselves are accepted.
    let text = format!("[escalation]\nprompt_timeout = 3600\ntimeout = 1\noutput_limit = \"1G\"\n{PROFILE}");
    let config = Config::parse(&text, Path::new("cfg.toml"), Path::new("/home/dev")).unwrap();
    assert_eq!(config.escalation.output_limit, 1 << 30);
}

#[test]
fn profile_escalation_rules_join_the_global_ones() {
    let found = expect(
        "[[escalation.rules]]\nname = \"fetch\"\ncommand = [\"git\", \"fetch\"]\n\
         [profiles.a]\nimage = \"i\"\n\
         [profiles.a.escalation]\ntimeot = 5\n\
         [[profiles.a.escalation.rules]]\nname = \"fetch\"\ncommand = [\"git\", \"fetch\", \"--all\"]\n\
         [[profiles.a.escalation.rules]]\nname = \"test\"\ncommand = [\"make\", \"test\"]\n\
         [[profiles.a.escalation.rules]]\nname = \"test\"\ncommand = [\"make\"]\n\
         [profiles.b]\nimage = \"i\"\n\
         [[profiles.b.escalation.rules]]\nname = \"fetch-all\"\ncommand = [\"git\", \"fetch\", \"--all\"]\ncwd = \"..\"\nbogus = 1\n",
        &[
            (7, 1, "unknown key `timeot` in [profiles.a.escalation]"),
            (8, 1, "escalation rule name \"fetch\" is used twice"),
            (14, 1, "escalation rule name \"test\" is used twice"),
            (22, 7, "\"..\" contains `..`"),
            (23, 1, "unknown key `bogus` in an [[profiles.b.escalation.rules]] entry"),
        ],
    );
    assert!(found[0].hint.as_deref().unwrap().contains("did you mean `timeout`?"), "{}", found[0]);
    let both = found[1].hint.as_deref().unwrap();
    assert!(both.contains("among the global rules and the profile's") && both.contains("line 1 column 1"), "{both}");
    // A name used in two different profiles is fine: each has its own set.
    let config = Config::parse(
        "[profiles.a]\nimage = \"i\"\n[[profiles.a.escalation.rules]]\nname = \"t\"\ncommand = [\"true\"]\n\
         [profiles.b]\nimage = \"i\"\n[[profiles.b.escalation.rules]]\nname = \"t\"\ncommand = [\"false\"]\n",
        Path::new("cfg.toml"),
        Path::new("/home/dev"),
    )
    .unwrap();
    assert_eq!(config.profile("b").unwrap().escalation.rules[0].command, vec!["false"]);
    assert!(config.escalation.rules.is_empty());
}

#[test]
fn default_profile_must_exist_and_profiles_must_be_present() {
    let found = expect(
        "default_profile = \"claud\"\n[profiles.claude]\nimage = \"i\"\n",
        &[(1, 19, "`default_profile` names \"claud\", which is not defined")],
    );
    assert!(found[0].hint.as_deref().unwrap().contains("did you mean \"claude\"?"));
    expect("storage_root = \"/x\"\n", &[(1, 1, "the configuration defines no profile")]);
    expect("[profiles]\n", &[(1, 1, "`profiles` defines no profile")]);
}

#[test]
fn dns_lists() {
    expect(
        &format!("dns = [\"1.1.1.1\", \"1.1.1.1\", \"1.1.1.1:53\"]\n{PROFILE}dns = [\"::1\", 5]\n"),
        &[
            (1, 19, "DNS server 1.1.1.1 is listed twice"),
            (1, 30, "\"1.1.1.1:53\" is not an IP address"),
            (4, 15, "elements of `dns` must be strings, found integer"),
        ],
    );
}

#[test]
fn network_pools() {
    expect(
        &format!("[network]\npool = \"fd00::/64\"\npool6 = \"fd6c::/120\"\ncolour = 1\n{PROFILE}"),
        &[
            (2, 8, "`network.pool` must be an IPv4 prefix of length /30 or shorter, not fd00::/64"),
            (3, 9, "`network.pool6` must be an IPv6 prefix of length /96 or shorter, not fd6c::/120"),
            (4, 1, "colour"),
        ],
    );
    expect(&format!("[network]\npool = \"100.96.0.1/16\"\n{PROFILE}"), &[(2, 8, "`network.pool`")]);
    let config = Config::parse(
        &format!("[network]\npool = \"100.64.0.0/20\"\npool6 = \"fd00:1::/80\"\n{PROFILE}"),
        Path::new("cfg.toml"),
        Path::new("/home/dev"),
    )
    .unwrap();
    assert_eq!(config.network.pool.map(|p| p.to_string()).as_deref(), Some("100.64.0.0/20"));
    assert_eq!(config.network.pool6.map(|p| p.to_string()).as_deref(), Some("fd00:1::/80"));
}
