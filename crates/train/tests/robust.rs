//! Property tests: random, truncated and bit-flipped checkpoints give an error when loaded,
//! never a panic; every file the project writes carries a checksum, so that any damage to
//! it is an error, never a silently different model (seeded cases, SplitMix64).

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use transformer_model::{ParamBuilder, Seq2Seq, Seq2SeqConfig, TransformerConfig};
use transformer_runtime::checkpoint;
use transformer_runtime::translate::{best, translate, DecodeRequest};
use transformer_text::bucket::SplitMix64;
use transformer_train::mt;

mod common;
use common::{flip_middle_byte, fresh, tiny_mt_config, Quiet};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("robust-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn damaged_checkpoints_are_errors() {
    let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 1);
    let cfg = Seq2SeqConfig {
        transformer: TransformerConfig::tiny(),
        src_vocab: 9,
        tgt_vocab: 9,
        share_embeddings: true,
        inputs: Default::default(),
    };
    Seq2Seq::with_config(&pb, &cfg).unwrap();
    let good_path = dir().join("good.safetensors");
    mt::save_weights(
        &good_path,
        &pb.params(),
        &transformer_runtime::model::MtModelConfig::Transformer(cfg),
    )
    .unwrap();
    let good = std::fs::read(&good_path).unwrap();
    assert!(checkpoint::load(&good_path, &Device::Cpu).is_ok());
    let p = dir().join("bad.safetensors");
    let mut c = SplitMix64::new(3);
    let mut rejected = 0;
    for _ in 0..300 {
        let mut bytes = good.clone();
        for _ in 0..1 + c.below(5) {
            let i = c.below(bytes.len());
            bytes[i] ^= 1 << c.below(8);
        }
        if c.below(2) == 0 {
            let cut = c.below(bytes.len());
            bytes.truncate(cut);
            std::fs::write(&p, &bytes).unwrap();
            // A truncated file never loads.
            assert!(checkpoint::load(&p, &Device::Cpu).is_err());
            rejected += 1;
        } else {
            std::fs::write(&p, &bytes).unwrap();
            // A flipped bit in the data itself may still load (the values differ); in the
            // header it must be an error. Either way: no panic.
            if checkpoint::load(&p, &Device::Cpu).is_err() {
                rejected += 1;
            }
        }
        let junk: Vec<u8> = (0..c.below(300)).map(|_| c.next_u64() as u8).collect();
        std::fs::write(&p, &junk).unwrap();
        assert!(checkpoint::load(&p, &Device::Cpu).is_err());
    }
    assert!(rejected > 150, "{rejected}");
}

/// Flips 1 to 5 random bits of `good` (and sometimes truncates it).
fn damaged(good: &[u8], c: &mut SplitMix64) -> Vec<u8> {
    let mut bytes = good.to_vec();
    for _ in 0..1 + c.below(5) {
        let i = c.below(bytes.len());
        bytes[i] ^= 1 << c.below(8);
    }
    if c.below(4) == 0 {
        bytes.truncate(c.below(bytes.len()));
    }
    bytes
}

#[test]
fn every_bit_flip_in_a_checksummed_file_is_an_error() {
    let d = dir().join("flip");
    std::fs::create_dir_all(&d).unwrap();
    let dev = Device::Cpu;
    let tensors = vec![
        (
            "w".to_string(),
            Tensor::arange(0f32, 64., &dev)
                .unwrap()
                .reshape((8, 8))
                .unwrap(),
        ),
        ("b".to_string(), Tensor::new(&[0.5f32, -1.5], &dev).unwrap()),
        ("n".to_string(), Tensor::new(&[3u32, 1, 4], &dev).unwrap()),
    ];
    let meta = HashMap::from([
        (
            "format".to_string(),
            "transformer-mt-checkpoint/1".to_string(),
        ),
        ("state".to_string(), "{\"step\":12}".to_string()),
    ]);
    let good_path = d.join("good.safetensors");
    checkpoint::save(&good_path, &tensors, meta).unwrap();
    let (loaded, m) = checkpoint::load(&good_path, &dev).unwrap();
    assert!(m.contains_key(checkpoint::CHECKSUM_KEY));
    assert_eq!(
        loaded["w"].flatten_all().unwrap().to_vec1::<f32>().unwrap()[63],
        63.
    );
    let good = std::fs::read(&good_path).unwrap();
    let p = d.join("bad.safetensors");
    let mut c = SplitMix64::new(17);
    for case in 0..2000 {
        let bytes = damaged(&good, &mut c);
        std::fs::write(&p, &bytes).unwrap();
        match checkpoint::load(&p, &dev) {
            Ok(_) => panic!("case {case}: a damaged file loaded"),
            Err(e) => assert!(e.to_string().contains("bad.safetensors"), "{e}"),
        }
    }
}

#[test]
fn files_without_a_checksum_load_and_non_finite_weights_are_refused() {
    let d = dir().join("old");
    std::fs::create_dir_all(&d).unwrap();
    let dev = Device::Cpu;
    // A file as written before checksums existed: no checksum in its metadata.
    let t = Tensor::new(&[1f32, 2., 3.], &dev).unwrap();
    let meta = HashMap::from([("format".to_string(), "x".to_string())]);
    let bytes = safetensors::serialize([("x", &t)], Some(meta.clone())).unwrap();
    let old = d.join("old.safetensors");
    std::fs::write(&old, bytes).unwrap();
    let (tensors, m) = checkpoint::load(&old, &dev).unwrap();
    assert_eq!(m, meta);
    assert_eq!(tensors["x"].to_vec1::<f32>().unwrap(), vec![1., 2., 3.]);
    // A NaN or an infinity, checksum or not, is refused with the tensor's name.
    for (i, v) in [f32::NAN, f32::INFINITY].into_iter().enumerate() {
        let bad = Tensor::new(&[1f32, v, 3.], &dev).unwrap();
        let p = d.join(format!("nan{i}.safetensors"));
        checkpoint::save(&p, &[("enc.w".to_string(), bad.clone())], HashMap::new()).unwrap();
        let e = checkpoint::load(&p, &dev).unwrap_err().to_string();
        assert!(e.contains("enc.w") && e.contains("non-finite"), "{e}");
        let bytes = safetensors::serialize([("enc.w", &bad)], None).unwrap();
        std::fs::write(&p, bytes).unwrap();
        assert!(checkpoint::load(&p, &dev).is_err());
    }
}

/// A tiny translation run (one epoch of a few batches) in `out`.
fn tiny_mt_run(data: &Path, out: &Path) {
    let (src, tgt) = (
        ["ein", "hund", "zwei", "katzen"],
        ["a", "dog", "two", "cats"],
    );
    for split in ["train", "valid"] {
        let (mut s, mut t) = (String::new(), String::new());
        for i in 0..60 {
            let ids = [i % 4, (i / 4) % 4, (i / 16) % 4];
            s += &(ids.map(|k| src[k]).join(" ") + "\n");
            t += &(ids
                .iter()
                .rev()
                .map(|&k| tgt[k])
                .collect::<Vec<_>>()
                .join(" ")
                + "\n");
        }
        std::fs::write(data.join(format!("{split}.de")), s).unwrap();
        std::fs::write(data.join(format!("{split}.en")), t).unwrap();
    }
    let config = transformer_runtime::config::MtTrainConfig {
        epochs: 1,
        max_tokens: 64,
        max_batches: Some(4),
        max_valid: Some(4),
        ..tiny_mt_config(data, false, 30, 16, 2, 1, 32)
    };
    mt::train(&fresh(config, out), &mut Quiet).unwrap();
}

/// The run-directory loader fed bit-flipped weights, checkpoints, configurations and
/// tokenizers: weights and checkpoints (checksummed) always fail with the file named; the
/// text files fail or load; nothing panics.
#[test]
fn damaged_run_directories_are_errors_never_panics() {
    let d = dir().join("rundir");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let run = d.join("run");
    tiny_mt_run(&d, &run);
    let dev = Device::Cpu;
    let reference =
        transformer_runtime::load::load_run(&run, &transformer_runtime::load::Execution::on(&dev))
            .unwrap();
    assert!(reference.note.is_none());
    let mut c = SplitMix64::new(5);
    for file in ["best.safetensors", "checkpoint.safetensors"] {
        let path = run.join(file);
        let good = std::fs::read(&path).unwrap();
        for case in 0..60 {
            std::fs::write(&path, damaged(&good, &mut c)).unwrap();
            let e = match file {
                "best.safetensors" => transformer_runtime::load::load_run(
                    &run,
                    &transformer_runtime::load::Execution::on(&dev),
                )
                .err(),
                _ => transformer_train::runner::Saved::load(
                    &run,
                    transformer_runtime::load::CHECKPOINT_FORMAT,
                    &dev,
                )
                .err(),
            };
            let e = e.unwrap_or_else(|| panic!("{file} case {case}: a damaged file loaded"));
            assert!(e.to_string().contains(file), "{e}");
        }
        std::fs::write(&path, &good).unwrap();
    }
    // A damaged best.safetensors says which file to fall back to.
    let best = run.join("best.safetensors");
    let good = flip_middle_byte(&best, 0x40);
    let e =
        transformer_runtime::load::load_run(&run, &transformer_runtime::load::Execution::on(&dev))
            .err()
            .unwrap()
            .to_string();
    assert!(e.contains("checksum") && e.contains("checkpoint"), "{e}");
    // Without best.safetensors the checkpoint's weights are used, and the note says so.
    std::fs::remove_file(&best).unwrap();
    let loaded =
        transformer_runtime::load::load_run(&run, &transformer_runtime::load::Execution::on(&dev))
            .unwrap();
    assert!(loaded.note.unwrap().contains("checkpoint.safetensors"));
    std::fs::write(&best, &good).unwrap();
    for file in ["config.toml", "tokenizer.json"] {
        let path = run.join(file);
        let good = std::fs::read(&path).unwrap();
        for _ in 0..40 {
            std::fs::write(&path, damaged(&good, &mut c)).unwrap();
            let _ = transformer_runtime::load::load_run(
                &run,
                &transformer_runtime::load::Execution::on(&dev),
            );
        }
        std::fs::write(&path, &good).unwrap();
    }
}

/// The length rule of translation: a source longer than the model takes is cut to it (and
/// named), no output is longer than the model can write, and the other sentences of the job
/// translate as they do alone; the loss of an over-long pair is scored on its first positions.
#[test]
fn over_long_sources_are_cut_to_the_model_and_the_job_goes_on() {
    let dev = Device::Cpu;
    let pb = ParamBuilder::new(DType::F32, &dev, 3);
    let cfg = Seq2SeqConfig {
        transformer: TransformerConfig {
            max_len: 16,
            ..TransformerConfig::tiny()
        },
        src_vocab: 12,
        tgt_vocab: 12,
        share_embeddings: true,
        inputs: Default::default(),
    };
    let model = transformer_runtime::model::MtModel::build(
        &pb,
        &transformer_runtime::model::MtModelConfig::Transformer(cfg),
    )
    .unwrap();
    let long: Vec<u32> = (0..40).map(|i| 4 + i % 8).collect();
    let src = vec![vec![5u32, 6, 7], long.clone(), vec![8, 9]];
    assert_eq!(
        transformer_runtime::translate::over_long(&model, &src),
        vec![transformer_runtime::translate::Truncated {
            index: 1,
            tokens: 40,
            kept: 15
        }]
    );
    let run_cfg = transformer_runtime::config::MtTrainConfig {
        max_len_a: 3.0,
        max_len_b: 5,
        ..transformer_runtime::config::MtTrainConfig::default()
    };
    for beam in [1, 3] {
        let request = DecodeRequest::new(run_cfg.decode_options(beam));
        let decoder = model.decoder().unwrap();
        let run =
            |src: &[Vec<u32>]| best(translate(&decoder, src, &request, &dev, |_, _| {}).unwrap());
        let hyps = run(&src);
        assert_eq!(hyps.len(), 3);
        assert!(hyps.iter().all(|h| h.tokens.len() <= 15), "{hyps:?}");
        for (i, s) in [(0, &src[0]), (2, &src[2])] {
            let alone = run(std::slice::from_ref(s));
            assert_eq!(alone[0].tokens, hyps[i].tokens);
        }
        let cut = run(&[long[..15].to_vec()]);
        assert_eq!(cut[0].tokens, hyps[1].tokens);
    }
    let data = mt::EncodedSplit {
        pairs: transformer_text::parallel::Pairs {
            src: vec![String::new(); 3],
            tgt: vec![String::new(); 3],
        },
        src: src.clone(),
        tgt: vec![vec![4, 5], long.clone(), vec![6]],
        specials: transformer_text::Specials::FIXED,
    };
    let loss = mt::evaluate_loss(&model, &data, 4096, &dev).unwrap();
    assert!(loss.is_finite() && loss > 0.0);
}
