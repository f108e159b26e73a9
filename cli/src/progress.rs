//! The progress bar on stderr: one bar per phase (prefetch, read), in bytes and GiB/s, driven by the library's progress callback; none when stderr is not a terminal.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use safeload::{report::Phase, report::Progress};

/// The bar's line: phase, bar, bytes of total, then the rate and files
/// (the message). The bar takes the width the rest leaves (`wide_bar`), so
/// that the line fits an 80-column terminal.
const TEMPLATE: &str = "{prefix:>8} [{wide_bar}] {binary_bytes}/{binary_total_bytes}  {msg}";

/// Progress bars for one command, shared with the library's reader
/// threads (the callback runs on them; `ProgressBar` is `Sync`, and the
/// lock only guards which phase's bar is current).
#[derive(Clone, Default)]
pub struct Bars {
    /// `None`: drawing is off (not a terminal, or `--no-progress`).
    state: Option<Arc<Mutex<Current>>>,
}

#[derive(Default)]
struct Current {
    phase: Option<Phase>,
    bar: Option<ProgressBar>,
}

impl Bars {
    /// Bars drawn on stderr where it is a terminal and `wanted`; none
    /// otherwise, so that a log file or a pipe gets no escape codes.
    /// (indicatif also draws nothing where `TERM` is unset or `dumb`.)
    pub fn on_stderr(wanted: bool) -> Bars {
        Bars {
            state: (wanted && std::io::stderr().is_terminal()).then(Arc::default),
        }
    }

    /// The callback for [`safeload::Loader::on_progress`], where bars are
    /// drawn.
    pub fn callback(&self) -> Option<impl Fn(&Progress) + Send + Sync + 'static> {
        let state = self.state.clone()?;
        Some(move |progress: &Progress| {
            let mut current = state.lock().unwrap_or_else(PoisonError::into_inner);
            current.show(progress);
        })
    }

    /// The work is over: where it succeeded the last bar stays on screen
    /// with its final figures, where it failed as it was, for the error to
    /// follow. Hands `result` back.
    pub fn close<T, E>(&self, result: Result<T, E>) -> Result<T, E> {
        self.end(if result.is_ok() {
            ProgressBar::finish
        } else {
            ProgressBar::abandon
        });
        result
    }

    fn end(&self, how: fn(&ProgressBar)) {
        let Some(state) = &self.state else {
            return;
        };
        let mut current = state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bar) = current.bar.take() {
            how(&bar);
        }
        current.phase = None;
    }
}

impl Current {
    fn show(&mut self, progress: &Progress) {
        // A phase with nothing to read (every file mapped lazily) gets no
        // bar: there are no bytes to count and no rate to claim.
        if progress.bytes_total == 0 {
            return;
        }
        if self.phase != Some(progress.phase) {
            if let Some(done) = self.bar.take() {
                done.finish();
            }
            self.phase = Some(progress.phase);
            self.bar = Some(new_bar(progress));
            return;
        }
        if let Some(bar) = &self.bar {
            bar.set_length(progress.bytes_total);
            bar.set_message(status(progress));
            bar.set_position(progress.bytes_done);
        }
    }
}

/// A bar for a new phase, drawn at once with its first figures: a fast
/// load may be over before indicatif's rate limit lets a second draw
/// through.
fn new_bar(progress: &Progress) -> ProgressBar {
    let style = ProgressStyle::with_template(TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    // Filled in while hidden, so that the first frame is not one of zeros.
    let bar =
        ProgressBar::with_draw_target(Some(progress.bytes_total), ProgressDrawTarget::hidden());
    bar.set_style(style);
    bar.set_prefix(progress.phase.to_string());
    bar.set_message(status(progress));
    bar.set_position(progress.bytes_done);
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.force_draw();
    bar
}

/// `1.52 GiB/s, 2/3 files`: the library's own rate for the phase (bytes
/// done over its elapsed time), not a guess from the bar's samples.
fn status(progress: &Progress) -> String {
    let files = format!("{}/{} files", progress.files_done, progress.files_total);
    if progress.bytes_done == 0 {
        files
    } else {
        format!("{:.2} GiB/s, {files}", progress.gib_per_s())
    }
}
