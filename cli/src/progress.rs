//! Progress of `lazaret image pull` on the developer's terminal: one
//! redrawn bar per layer. Elsewhere (not a terminal, the coordinator's log)
//! progress is the coordinator's plain lines ([`images::LineProgress`]).

use std::cell::RefCell;
use std::io::Write;
use std::time::Duration;

use lazaret_coordinator::images::{self, LayerInfo, PullProgress, mib, short};

/// The progress for this invocation: none when quiet, bars on a terminal,
/// lines otherwise.
pub fn for_stderr(quiet: bool) -> Box<dyn PullProgress> {
    use std::io::IsTerminal;
    if quiet {
        Box::new(images::NoProgress)
    } else if std::io::stderr().is_terminal() {
        Box::new(Bars::default())
    } else {
        Box::new(images::LineProgress::default())
    }
}

/// One redrawn line per layer on a terminal.
#[derive(Default)]
pub struct Bars {
    state: RefCell<BarState>,
}

#[derive(Default)]
struct BarState {
    layers: Vec<(String, u64, u64, bool)>,
    drawn: usize,
}

impl Bars {
    fn redraw(&self) {
        let mut state = self.state.borrow_mut();
        let mut out = std::io::stderr().lock();
        if state.drawn > 0 {
            let _ = write!(out, "\x1b[{}A", state.drawn);
        }
        for (digest, done, total, finished) in &state.layers {
            let fraction = if *total == 0 { 1.0 } else { *done as f64 / *total as f64 };
            let width = 30usize;
            let filled = ((fraction * width as f64) as usize).min(width);
            let status = if *finished { "done".to_string() } else { format!("{:5.1}%", fraction * 100.0) };
            let _ = writeln!(
                out,
                "\x1b[2K{} [{}{}] {:>8.1}/{:.1} MiB {}",
                short(digest),
                "#".repeat(filled),
                " ".repeat(width - filled),
                mib(*done),
                mib(*total),
                status
            );
        }
        state.drawn = state.layers.len();
        let _ = out.flush();
    }
}

impl PullProgress for Bars {
    fn resolved(&self, reference: &str, digest: &str, layers: &[LayerInfo]) {
        eprintln!("pulling {reference} ({digest})");
        self.state.borrow_mut().layers =
            layers.iter().map(|l| (l.digest.clone(), if l.cached { l.size } else { 0 }, l.size, l.cached)).collect();
        self.redraw();
    }
    fn layer_progress(&self, digest: &str, done: u64, _total: u64) {
        if let Some(entry) = self.state.borrow_mut().layers.iter_mut().find(|l| l.0 == digest) {
            entry.1 = done;
        }
        self.redraw();
    }
    fn retrying(&self, what: &str, attempt: u32, delay: Duration, reason: &str) {
        self.state.borrow_mut().drawn = 0;
        eprintln!("retry {} (attempt {attempt}) in {:.1}s: {reason}", short(what), delay.as_secs_f64());
    }
    fn layer_done(&self, digest: &str) {
        if let Some(entry) = self.state.borrow_mut().layers.iter_mut().find(|l| l.0 == digest) {
            entry.1 = entry.2;
            entry.3 = true;
        }
        self.redraw();
    }
    fn unpacking(&self) {
        eprintln!("unpacking");
    }
}
