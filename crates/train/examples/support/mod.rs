//! What the profiling examples share: timing a phase and printing its minimum and median.

use std::time::Instant;

/// Runs `f` once to warm up, then `reps` times, and prints the minimum and the median of the
/// timed runs in milliseconds after `label`.
pub fn time<R>(label: &str, reps: usize, mut f: impl FnMut() -> R) {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    println!(
        "{label:<44} min {:8.2} ms  median {:8.2} ms",
        v[0],
        v[v.len() / 2]
    );
}
