//! Property test: random, truncated and bit-flipped checkpoints give an error when loaded,
//! never a panic (seeded cases, SplitMix64).

use candle_core::{DType, Device};
use std::path::PathBuf;
use transformer_model::{ParamBuilder, Seq2Seq, Seq2SeqConfig, TransformerConfig};
use transformer_train::{checkpoint, mt};

struct Cases(u64);

impl Cases {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

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
    };
    Seq2Seq::with_config(&pb, &cfg).unwrap();
    let good_path = dir().join("good.safetensors");
    mt::save_weights(
        &good_path,
        &pb.params(),
        &mt::MtModelConfig::Transformer(cfg),
    )
    .unwrap();
    let good = std::fs::read(&good_path).unwrap();
    assert!(checkpoint::load(&good_path, &Device::Cpu).is_ok());
    let p = dir().join("bad.safetensors");
    let mut c = Cases(3);
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
        let junk: Vec<u8> = (0..c.below(300)).map(|_| c.next() as u8).collect();
        std::fs::write(&p, &junk).unwrap();
        assert!(checkpoint::load(&p, &Device::Cpu).is_err());
    }
    assert!(rejected > 150, "{rejected}");
}
