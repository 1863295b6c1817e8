//! Decoding a target sequence token by token from an encoder-decoder model.

use candle_core::{Result, Tensor, D};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{Mode, Seq2Seq};

/// Greedy decoding: encode the source once, then repeatedly append the most likely next
/// token. Every sequence starts with `bos`; a sequence stops growing after `eos` (if given).
/// Returns the generated tokens after `bos`, up to and including `eos`.
///
/// Each step re-runs the decoder over the whole prefix (no key/value cache yet).
///
/// # Shapes
/// src (B, S) u32 -> B sequences of at most `max_len` tokens
pub fn greedy(
    model: &Seq2Seq,
    src: &Tensor,
    pad_id: u32,
    bos: u32,
    eos: Option<u32>,
    max_len: usize,
) -> Result<Vec<Vec<u32>>> {
    let (b, _s) = src.dims2()?;
    let dev = src.device();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
    let mut done = vec![false; b];
    let mut prefix: Vec<Vec<u32>> = vec![vec![bos]; b];
    let bos_ids = Tensor::new(vec![bos; b], dev)?.unsqueeze(1)?;
    let src_masks = Seq2SeqMasks::new(src, &bos_ids, pad_id)?;
    let memory = model.encode(src, Some(&src_masks.src), Mode::Eval)?;
    for _ in 0..max_len {
        let t = prefix[0].len();
        let flat: Vec<u32> = prefix.iter().flatten().copied().collect();
        let tgt = Tensor::from_vec(flat, (b, t), dev)?;
        let masks = Seq2SeqMasks::new(src, &tgt, pad_id)?;
        let logits = model.decode(
            &tgt,
            &memory,
            Some(&masks.tgt),
            Some(&masks.memory),
            Mode::Eval,
        )?;
        // (B, T, V) -> (B, V) at the last position -> (B,)
        let next = logits
            .narrow(1, t - 1, 1)?
            .squeeze(1)?
            .argmax(D::Minus1)?
            .to_vec1::<u32>()?;
        for i in 0..b {
            // Finished sequences keep growing with padding so the batch stays rectangular.
            let tok = if done[i] { pad_id } else { next[i] };
            prefix[i].push(tok);
            if !done[i] {
                out[i].push(tok);
                done[i] = eos == Some(tok);
            }
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    Ok(out)
}
