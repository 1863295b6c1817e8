//! End to end: the copy task trains from scratch on the runner and decodes its inputs back;
//! stopped midway and resumed, it gives the same losses and the same result.

use transformer_train::copy_task::{train, CopyTaskConfig};
use transformer_train::runner::RunOptions;

mod common;
use common::{fresh, Quiet};

fn opts(name: &str, resume: bool, stop: Option<usize>) -> RunOptions<CopyTaskConfig> {
    let out = std::env::temp_dir().join(format!("copy-test-{name}-{}", std::process::id()));
    if !resume {
        let _ = std::fs::remove_dir_all(&out);
    }
    RunOptions {
        resume,
        stop_after_steps: stop,
        ..fresh(CopyTaskConfig::default(), out)
    }
}

#[test]
fn copy_task_trains_and_decodes_inputs_back() {
    let cfg = CopyTaskConfig::default();
    let start = std::time::Instant::now();
    let whole = train(&opts("whole", false, None), &mut Quiet).unwrap();
    let first: f64 = whole.losses[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = whole.losses[cfg.steps - 10..].iter().sum::<f64>() / 10.0;
    let acc = whole.accuracy.unwrap();
    eprintln!(
        "copy task: loss {first:.3} -> {last:.3} in {} steps, {:.1}s; exact copies {:.1}%",
        cfg.steps,
        start.elapsed().as_secs_f64(),
        100.0 * acc
    );
    assert!(
        first > 1.5,
        "untrained loss should be near ln(10), got {first}"
    );
    assert!(last < 0.3, "loss after training {last}");
    assert!(
        acc >= 0.95,
        "only {:.0}% of sequences copied exactly",
        100.0 * acc
    );

    // Stopped after 300 steps (with a checkpoint) and resumed: the same run.
    let part = train(&opts("split", false, Some(300)), &mut Quiet).unwrap();
    assert!(part.accuracy.is_none());
    let rest = train(&opts("split", true, None), &mut Quiet).unwrap();
    let mut all = part.losses;
    all.extend(rest.losses);
    assert_eq!(all, whole.losses);
    assert_eq!(rest.accuracy, whole.accuracy);
    for name in ["whole", "split"] {
        let _ = std::fs::remove_dir_all(opts(name, true, None).out);
    }
}
