//! End to end: the copy task trains from scratch and decodes its inputs back.

use candle_core::{Device, Result};
use transformer_model::Rng;
use transformer_train::copy_task::{copy_accuracy, random_batch, train, CopyTaskConfig};

#[test]
fn copy_task_trains_and_decodes_inputs_back() -> Result<()> {
    let cfg = CopyTaskConfig::default();
    let dev = Device::Cpu;
    let start = std::time::Instant::now();
    let trained = train(&cfg, &dev, |_, _, _| {})?;
    let first: f64 = trained.losses[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = trained.losses[cfg.steps - 10..].iter().sum::<f64>() / 10.0;
    let src = random_batch(
        &Rng::new(12345),
        &CopyTaskConfig {
            batch_size: 64,
            ..cfg.clone()
        },
        &dev,
    )?;
    let acc = copy_accuracy(&trained.model, &src)?;
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
    Ok(())
}
