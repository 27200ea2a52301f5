//! Progress display (indicatif): a bar over the runs of an experiment and a
//! spinner for builds.  Both draw on standard error and hide themselves when
//! it is not a terminal, so logs and CI output stay clean.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` runs.
pub fn bar(len: u64, prefix: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    let style = ProgressStyle::with_template(
        "{prefix:>14} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(prefix.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A spinner with a message, for work of unknown length.
pub fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    pb.set_style(style);
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}
