//! Cross-entropy over logits, with positions to skip (padding).

use candle_core::{DType, Result, Tensor, D};

/// `log_softmax` over the last dimension, composed of primitives (so it has a backward):
/// `x - max - log(sum(exp(x - max)))`, the maximum detached since the result does not depend
/// on it.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

/// Mean negative log-likelihood of `targets` under `logits`, as PyTorch's
/// `nn.CrossEntropyLoss` (mean reduction, `ignore_index`). Positions whose target equals
/// `ignore` count neither in the sum nor in the mean. Returns `(loss, counted positions)`.
///
/// # Shapes
/// logits (N, V), targets (N,) u32 -> scalar
pub fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    ignore: Option<u32>,
) -> Result<(Tensor, usize)> {
    let (n, v) = logits.dims2()?;
    if targets.dims() != [n] {
        candle_core::bail!(
            "cross_entropy: {n} rows of logits but targets have shape {:?}",
            targets.dims()
        );
    }
    if targets.dtype() != DType::U32 {
        candle_core::bail!(
            "cross_entropy: targets must be u32, got {:?}",
            targets.dtype()
        );
    }
    if n > 0 {
        let max = targets.max(0)?.to_scalar::<u32>()?;
        if max as usize >= v && ignore != Some(max) {
            candle_core::bail!("cross_entropy: target {max} is outside the {v} classes");
        }
    }
    let (safe_targets, weight, count) = match ignore {
        None => (targets.clone(), None, n),
        Some(pad) => {
            let keep = targets.ne(pad)?;
            let count = keep.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()? as usize;
            // Ignored targets may be out of range (e.g. -100 style ids); point them at class 0.
            let safe = keep.where_cond(targets, &targets.zeros_like()?)?;
            (safe, Some(keep.to_dtype(logits.dtype())?), count)
        }
    };
    // (N, V) -> (N, 1) -> (N,)
    let picked = log_softmax(logits)?
        .gather(&safe_targets.unsqueeze(1)?, 1)?
        .squeeze(1)?;
    let picked = match weight {
        Some(w) => (picked * w)?,
        None => picked,
    };
    let loss = (picked.sum_all()?.neg()? / count.max(1) as f64)?;
    Ok((loss, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn uniform_logits_give_log_v_and_padding_is_skipped() -> Result<()> {
        let dev = Device::Cpu;
        let logits = Tensor::zeros((3, 4), DType::F64, &dev)?;
        let targets = Tensor::new(&[1u32, 2, 3], &dev)?;
        let (loss, n) = cross_entropy(&logits, &targets, None)?;
        assert_eq!(n, 3);
        assert!((loss.to_scalar::<f64>()? - 4f64.ln()).abs() < 1e-12);

        // Row 1 would add a huge loss if it were counted.
        let logits = Tensor::new(&[[0f64, 0.], [50., -50.], [0., 0.]], &dev)?;
        let targets = Tensor::new(&[0u32, 1, 1], &dev)?;
        let (loss, n) = cross_entropy(&logits, &targets, Some(1))?;
        assert_eq!(n, 1);
        assert!((loss.to_scalar::<f64>()? - 2f64.ln()).abs() < 1e-12);
        Ok(())
    }
}
