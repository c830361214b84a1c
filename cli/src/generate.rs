//! `lazaret completions SHELL` and `lazaret man`: generated at run time from
//! the command's own clap definition, so they never drift from it.
//! scripts/setup.sh installs their output.

use std::io::Write;

use anyhow::{Context as _, Result};
use clap_complete::Shell;

/// Writes `shell`'s completion script for `command`, called `name`, to
/// `out`. Hidden subcommands (the internal `__coordinator`) are left out:
/// clap_complete would offer them.
pub fn completions(command: clap::Command, name: &'static str, shell: Shell, out: &mut dyn Write) -> Result<()> {
    let mut visible = clap::Command::new(name)
        .version(env!("CARGO_PKG_VERSION"))
        .args(command.get_arguments().cloned())
        .subcommands(command.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    clap_complete::generate(shell, &mut visible, name, out);
    Ok(())
}

/// Writes the man page (roff) of `command` to `out`.
pub fn man(command: clap::Command, out: &mut dyn Write) -> Result<()> {
    clap_mangen::Man::new(command).render(out).context("writing the man page")
}

/// Writes `text` to stdout; a reader that went away early (`| head`) is
/// not an error.
pub fn to_stdout(text: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::Error::new(e).context("writing to standard output")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> clap::Command {
        clap::Command::new("lazaret")
            .about("Run agents.")
            .after_help("Exit status:\n  125  Lazaret failed")
            .subcommand(clap::Command::new("run").about("Run a profile"))
            .subcommand(clap::Command::new("__coordinator").hide(true))
    }

    #[test]
    fn every_shell_gets_a_script_naming_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            completions(sample(), "lazaret", shell, &mut out).expect("generate");
            let text = String::from_utf8(out).expect("utf-8");
            assert!(text.contains("run"), "{shell}: {text}");
            assert!(text.contains("lazaret"), "{shell}: {text}");
            assert!(!text.contains("__coordinator"), "{shell} offers the hidden subcommand: {text}");
        }
    }

    #[test]
    fn the_man_page_is_roff_with_the_exit_status() {
        let mut out = Vec::new();
        man(sample(), &mut out).expect("render");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.starts_with(".ie") || text.starts_with(".TH"), "{}", &text[..text.len().min(200)]);
        assert!(text.contains(".TH lazaret 1"), "{text}");
        assert!(text.contains("125"), "the exit codes are in the page: {text}");
    }
}
