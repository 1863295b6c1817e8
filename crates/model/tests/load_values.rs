//! A model built from its loaded values (`ParamBuilder::with_values` + `assign_rest`) holds
//! exactly what a model drawn at random and then assigned the same values holds, and a file
//! that does not fit the model is refused with the same error, whichever way it is loaded.

use candle_core::{DType, Device, Result, Tensor};
use std::collections::HashMap;
use transformer_model::{ParamBuilder, Seq2Seq, Seq2SeqConfig, TransformerConfig};

fn config() -> Seq2SeqConfig {
    Seq2SeqConfig {
        transformer: TransformerConfig::tiny(),
        src_vocab: 11,
        tgt_vocab: 11,
        share_embeddings: true,
        inputs: Default::default(),
    }
}

/// Every parameter of a model built with `seed`, by name.
fn weights(seed: u64) -> Result<HashMap<String, Tensor>> {
    let pb = ParamBuilder::new(DType::F32, &Device::Cpu, seed);
    Seq2Seq::with_config(&pb, &config())?;
    Ok(pb
        .params()
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_tensor().copy().unwrap()))
        .collect())
}

/// Loads `tensors` the old way (a model drawn with seed 3, then `assign`) and the new way
/// (`with_values`, then `assign_rest`): both models' parameters, or both errors.
#[allow(clippy::type_complexity)]
fn both_ways(
    tensors: &HashMap<String, Tensor>,
) -> (
    std::result::Result<Vec<(String, Vec<f32>)>, String>,
    std::result::Result<Vec<(String, Vec<f32>)>, String>,
) {
    let flat = |pb: &ParamBuilder| -> Vec<(String, Vec<f32>)> {
        pb.params()
            .iter()
            .map(|(n, v)| {
                let values = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
                (n.to_string(), values)
            })
            .collect()
    };
    let old = ParamBuilder::new(DType::F32, &Device::Cpu, 3);
    Seq2Seq::with_config(&old, &config()).unwrap();
    // The message (its first line: candle may add a backtrace, which names the caller).
    let said = |e: candle_core::Error| e.to_string().lines().next().unwrap_or("").to_string();
    let old = match old.params().assign(tensors) {
        Ok(()) => Ok(flat(&old)),
        Err(e) => Err(said(e)),
    };
    let new = ParamBuilder::new(DType::F32, &Device::Cpu, 3).with_values(tensors.clone());
    Seq2Seq::with_config(&new, &config()).unwrap();
    let new = match new.assign_rest() {
        Ok(()) => Ok(flat(&new)),
        Err(e) => Err(said(e)),
    };
    (old, new)
}

#[test]
fn a_model_built_from_its_values_equals_one_assigned_them() -> Result<()> {
    let saved = weights(7)?;
    let (old, new) = both_ways(&saved);
    let (old, new) = (old.unwrap(), new.unwrap());
    assert_eq!(old, new);
    // And they are the saved values, not the ones seed 3 draws (Xavier re-initialisation
    // included): every parameter equal to the file's.
    for (name, values) in &new {
        let want: Vec<f32> = saved[name].flatten_all()?.to_vec1()?;
        assert_eq!(values, &want, "{name}");
    }
    Ok(())
}

#[test]
fn a_file_that_does_not_fit_is_refused_alike() -> Result<()> {
    let saved = weights(7)?;
    let mut missing = saved.clone();
    assert!(missing
        .remove("transformer.encoder.layers.1.linear2.weight")
        .is_some());
    let mut reshaped = saved.clone();
    assert!(reshaped
        .insert(
            "transformer.decoder.layers.0.self_attn.q_proj.weight".into(),
            Tensor::zeros((3, 5), DType::F32, &Device::Cpu)?,
        )
        .is_some());
    let mut extra = saved.clone();
    extra.insert(
        "transformer.decoder.layers.9.norm1.weight".into(),
        Tensor::zeros(4, DType::F32, &Device::Cpu)?,
    );
    for (case, tensors, says) in [
        ("missing", missing, "weights have no tensor"),
        ("reshaped", reshaped, "has shape [3, 5]"),
        ("extra", extra, "that this model does not use"),
    ] {
        let (old, new) = match both_ways(&tensors) {
            (Err(old), Err(new)) => (old, new),
            (old, new) => panic!("{case}: loaded ({} / {})", old.is_ok(), new.is_ok()),
        };
        assert_eq!(old, new, "{case}");
        assert!(new.contains(says), "{case}: {new}");
    }
    Ok(())
}
