//! Whether `--precision bf16` pays on this CPU, and what it means on a GPU.
//!
//! On a GPU bf16 is always taken as asked: the composed layers' products run in bf16 on the
//! tensor cores with f32 master weights, PyTorch's autocast
//! ([`transformer_model::ops::matmul`]).
//!
//! bf16 products are not faster everywhere: on a Zen 4 with AVX512-BF16 the output layer's
//! products run about 1.45x the fp32 rate, while on an Intel Emerald Rapids without AMX
//! exposed the language model's bf16 step measured 260 ms against 166 ms in fp32
//! (2026-11-24). So a fresh run that asks for bf16 first times the one op that bf16 changes,
//! the output layer with its loss, forward and backward, at the run's own sizes, in both
//! precisions, and trains in bf16 only when bf16 was faster; the log says what was measured
//! and chosen. The choice is written into the run's `config.toml`, so that `--resume`
//! continues in the same arithmetic without measuring again.

use candle_core::{DType, Device, Result, Tensor, Var};
use std::time::Instant;
use transformer_model::{bf16, linear_cross_entropy_with, Precision};

/// The arithmetic a run asking for `requested` trains in, and the log line that says why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// What the run uses.
    pub precision: Precision,
    /// What to tell the user (`None` when f32 was asked for).
    pub line: Option<String>,
}

/// Chooses the precision of a fresh run that asks for `requested`, for an output layer of
/// `rows` x `d_model` -> `vocab` on the CPU: bf16 only where its products exist here and
/// measure faster than f32 at these sizes (see the module docs). `covers` names the products
/// bf16 runs in the log line (the language model: the output layer's; translation: also the
/// encoder's and decoder's, on the same unit, so the output layer's timing decides for all).
/// With `measure` false, bf16 is used as asked wherever its units exist. Off the CPU
/// (`device`), bf16 is used as asked (see the module docs).
pub fn choose(
    device: &Device,
    requested: Precision,
    measure: bool,
    rows: usize,
    d_model: usize,
    vocab: usize,
    covers: &str,
) -> Result<Choice> {
    if requested == Precision::F32 {
        return Ok(Choice {
            precision: Precision::F32,
            line: None,
        });
    }
    if !device.is_cpu() {
        return Ok(Choice {
            precision: Precision::Bf16,
            line: Some(
                "precision: bf16 mixed precision on the GPU: the products of the linear \
                 layers, of attention and of the output layer in bf16 with f32 master weights \
                 (autocast); validation, test and decoding in f32"
                    .into(),
            ),
        });
    }
    let Some(unit) = bf16::backend() else {
        return Ok(Choice {
            precision: Precision::F32,
            line: Some(
                "precision: bf16 asked for, but this CPU has neither AMX nor AVX512-BF16 \
                 (or TRANSFORMER_NO_BF16 is set): training in f32"
                    .into(),
            ),
        });
    };
    if !measure {
        return Ok(Choice {
            precision: Precision::Bf16,
            line: Some(format!(
                "precision: bf16 mixed precision for {covers} (as {}), as asked, not measured \
                 against f32; validation, test and decoding in f32",
                unit.describe()
            )),
        });
    }
    let (f32_ms, bf16_ms) = time_output_layer(rows.max(1), d_model, vocab)?;
    Ok(decide(
        unit,
        (rows, d_model, vocab),
        f32_ms,
        bf16_ms,
        covers,
    ))
}

/// [`choose`]'s decision once both precisions are timed.
fn decide(
    unit: bf16::Backend,
    (rows, d_model, vocab): (usize, usize, usize),
    f32_ms: f64,
    bf16_ms: f64,
    covers: &str,
) -> Choice {
    let measured = format!(
        "the output layer's forward and backward passes at this run's sizes ({rows} x \
         {d_model} -> {vocab}) measured {bf16_ms:.1} ms with bf16 products as {} against \
         {f32_ms:.1} ms in f32",
        unit.describe()
    );
    if bf16_ms < f32_ms {
        Choice {
            precision: Precision::Bf16,
            line: Some(format!(
                "precision: bf16 mixed precision for {covers}: {measured}; validation, test \
                 and decoding in f32"
            )),
        }
    } else {
        Choice {
            precision: Precision::F32,
            line: Some(format!(
                "precision: bf16 asked for, but on this CPU it is slower: {measured}; \
                 training in f32 (config.toml says so; --resume keeps it)"
            )),
        }
    }
}

/// Median milliseconds of the fused output layer and loss, forward and backward, in f32 and
/// in bf16, alternating (one untimed pass each first).
pub fn time_output_layer(rows: usize, d_model: usize, vocab: usize) -> Result<(f64, f64)> {
    let dev = Device::Cpu;
    // Deterministic inputs of the scale training sees (no RNG needed: the values only have
    // to be ordinary numbers).
    let fill = |n: usize, scale: f32, salt: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + salt) % 1000) as f32 / 1000.0 * 2.0 * scale - scale)
            .collect()
    };
    let x = Var::from_tensor(&Tensor::from_vec(
        fill(rows * d_model, 1.0, 1),
        (rows, d_model),
        &dev,
    )?)?;
    let w = Var::from_tensor(&Tensor::from_vec(
        fill(vocab * d_model, 0.05, 2),
        (vocab, d_model),
        &dev,
    )?)?;
    let b = Var::from_tensor(&Tensor::zeros(vocab, DType::F32, &dev)?)?;
    let targets: Vec<u32> = (0..rows).map(|i| ((i * 104_729) % vocab) as u32).collect();
    let targets = Tensor::from_vec(targets, rows, &dev)?;
    let pass = |p: Precision| -> Result<f64> {
        let t = Instant::now();
        let loss = linear_cross_entropy_with(x.as_tensor(), &w, &b, &targets, None, p)?;
        loss.backward()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    pass(Precision::F32)?;
    pass(Precision::Bf16)?;
    let (mut f, mut h) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        f.push(pass(Precision::F32)?);
        h.push(pass(Precision::Bf16)?);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(f), median(h)))
}

/// The precision a run trains in and the log line that says why: a resumed run keeps the one
/// its `config.toml` records (said in the log when it is bf16, [`resumed_line`]); a fresh run
/// [`choose`]s, for an output layer of `shape` (rows, d_model, vocabulary).
pub fn settle(
    device: &Device,
    resuming: bool,
    requested: Precision,
    measure: bool,
    (rows, d_model, vocab): (usize, usize, usize),
    covers: &str,
) -> Result<Choice> {
    if resuming {
        return Ok(Choice {
            precision: requested,
            line: (requested == Precision::Bf16).then(|| resumed_line(covers)),
        });
    }
    choose(device, requested, measure, rows, d_model, vocab, covers)
}

/// The log line of a resumed run configured for bf16 (measured when the run started);
/// `covers` as in [`choose`].
pub fn resumed_line(covers: &str) -> String {
    match bf16::backend() {
        Some(unit) => format!(
            "precision: bf16 mixed precision for {covers} (as {}), as the run was configured; \
             validation, test and decoding in f32",
            unit.describe()
        ),
        None => "precision: the run was configured for bf16, but this CPU has neither AMX nor \
                 AVX512-BF16 (or TRANSFORMER_NO_BF16 is set): training in f32"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 is chosen only when it measured faster, and the line says what was measured.
    #[test]
    fn bf16_only_where_it_measured_faster() {
        let unit = bf16::Backend::Avx512Bf16;
        let faster = decide(unit, (700, 200, 33278), 131.9, 84.9, "the products");
        assert_eq!(faster.precision, Precision::Bf16);
        let line = faster.line.unwrap();
        assert!(
            line.contains("84.9 ms") && line.contains("131.9 ms") && line.contains("the products"),
            "{line}"
        );
        let slower = decide(unit, (700, 200, 33278), 166.0, 260.0, "the products");
        assert_eq!(slower.precision, Precision::F32);
        assert!(slower.line.unwrap().contains("slower"));
        assert_eq!(
            decide(unit, (1, 1, 1), 5.0, 5.0, "x").precision,
            Precision::F32
        );
        let f32_asked = choose(&Device::Cpu, Precision::F32, true, 10, 4, 7, "x").unwrap();
        assert_eq!(
            (f32_asked.precision, f32_asked.line),
            (Precision::F32, None)
        );
    }

    /// The timing runs both kernels on small sizes and returns positive times.
    #[test]
    fn timing_runs_both_precisions() {
        let (f, b) = time_output_layer(16, 8, 50).unwrap();
        assert!(f > 0.0 && b > 0.0);
    }
}
