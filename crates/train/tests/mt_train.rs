//! The translation training path on a small synthetic parallel corpus: it learns, it resumes
//! exactly, and bad input gets errors that name the file and the fix.

use std::path::{Path, PathBuf};
use transformer_model::Rng;
use transformer_runtime::config::MtTrainConfig;
use transformer_train::metrics::{self, Metric, Scores, Weights};
use transformer_train::mt::{self, MtTrainOptions};
use transformer_train::runner::Progress;

mod common;
use common::{fresh, tiny_mt_config, Quiet};

/// A fresh, empty folder for one of these tests.
fn temp_dir(name: &str) -> PathBuf {
    common::temp_dir("mt-test", name)
}

/// A fresh folder holding the corpus of `write_corpus`.
fn corpus_dir(name: &str) -> PathBuf {
    let d = temp_dir(name);
    write_corpus(&d);
    d
}

/// A toy language pair: the target is the source's words mapped one to one and reversed, so
/// a model must attend to the source to translate.
pub fn write_corpus(dir: &Path) {
    let src_words = [
        "ein", "hund", "läuft", "schnell", "zwei", "katzen", "schlafen", "im", "haus",
    ];
    let tgt_words = [
        "a", "dog", "runs", "fast", "two", "cats", "sleep", "in", "house",
    ];
    let rng = Rng::new(9);
    for (split, n) in [("train", 400), ("valid", 30), ("test", 30)] {
        let (mut s, mut t) = (String::new(), String::new());
        for _ in 0..n {
            let len = 2 + rng.below(5);
            let ids: Vec<usize> = (0..len).map(|_| rng.below(src_words.len())).collect();
            let src: Vec<&str> = ids.iter().map(|&i| src_words[i]).collect();
            let tgt: Vec<&str> = ids.iter().rev().map(|&i| tgt_words[i]).collect();
            s.push_str(&(src.join(" ") + " .\n"));
            t.push_str(&(tgt.join(" ") + " .\n"));
        }
        std::fs::write(dir.join(format!("{split}.de")), s).unwrap();
        std::fs::write(dir.join(format!("{split}.en")), t).unwrap();
    }
}

pub fn small_config(dir: &Path) -> MtTrainConfig {
    MtTrainConfig {
        warmup: 30,
        lr_factor: 0.1,
        epochs: 8,
        max_tokens: 160,
        log_interval: 5,
        checkpoint_interval: 7,
        beam: 3,
        ..tiny_mt_config(dir, true, 60, 32, 4, 2, 64)
    }
}

fn opts(cfg: &MtTrainConfig, out: &Path, resume: bool, stop: Option<usize>) -> MtTrainOptions {
    MtTrainOptions {
        resume,
        stop_after_steps: stop,
        ..fresh(cfg.clone(), out)
    }
}

#[test]
fn trains_translates_and_resumes_exactly() {
    let dir = corpus_dir("resume");
    let cfg = small_config(&dir);
    let whole = mt::train(&opts(&cfg, &dir.join("whole"), false, None), &mut Quiet).unwrap();
    let (test_loss, test_bleu) = whole.test.unwrap();
    let losses = &whole.step_losses;
    assert!(
        losses.last().unwrap() < &(losses[0] * 0.5),
        "the loss did not fall: {} -> {}",
        losses[0],
        losses.last().unwrap()
    );
    eprintln!("test loss {test_loss}, BLEU {test_bleu}");
    assert!(test_loss < 1.0, "test loss {test_loss}");
    assert!(test_bleu > 10.0, "test BLEU {test_bleu}");

    // Stopped twice (once mid-epoch, once between checkpoints) and resumed: the same losses
    // and the same final weights, bit for bit.
    let out = dir.join("parts");
    let mut parts = Vec::new();
    for (resume, stop) in [(false, Some(11)), (true, Some(20)), (true, None)] {
        let s = mt::train(&opts(&cfg, &out, resume, stop), &mut Quiet).unwrap();
        parts.extend(s.step_losses);
    }
    assert_eq!(&parts, losses);
    let a = transformer_runtime::load::load_run(
        &dir.join("whole"),
        &transformer_runtime::load::Execution::on(&candle_core::Device::Cpu),
    )
    .unwrap();
    let b = transformer_runtime::load::load_run(
        &out,
        &transformer_runtime::load::Execution::on(&candle_core::Device::Cpu),
    )
    .unwrap();
    for ((n, x), (_, y)) in a.params.iter().zip(b.params.iter()) {
        let d = (x.as_tensor() - y.as_tensor())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(d, 0.0, "{n}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("whole/test.hyp")).unwrap(),
        std::fs::read_to_string(out.join("test.hyp")).unwrap()
    );
}

#[test]
fn bad_input_names_the_file_and_the_fix() {
    let dir = corpus_dir("bad");
    let mut text = std::fs::read_to_string(dir.join("train.en")).unwrap();
    text.push_str("one line too many\n");
    std::fs::write(dir.join("train_long.en"), text).unwrap();
    std::fs::write(dir.join("empty.de"), "").unwrap();
    std::fs::write(dir.join("empty.en"), "").unwrap();
    // (run folder, the configuration's broken part, what the error must say)
    let cases = [
        (
            "r1",
            MtTrainConfig {
                train_tgt: Some(dir.join("train_long.en")),
                ..small_config(&dir)
            },
            &["train.de has 400 lines", "train_long.en has 401"][..],
        ),
        (
            "r2",
            MtTrainConfig {
                train_src: Some(dir.join("missing.de")),
                ..small_config(&dir)
            },
            &["missing.de"],
        ),
        (
            "r3",
            MtTrainConfig {
                train_src: Some(dir.join("empty.de")),
                train_tgt: Some(dir.join("empty.en")),
                ..small_config(&dir)
            },
            &["empty.de", "no sentence pairs"],
        ),
    ];
    for (out, cfg, expected) in cases {
        let err = mt::train(&opts(&cfg, &dir.join(out), false, None), &mut Quiet)
            .err()
            .unwrap()
            .to_string();
        assert!(expected.iter().all(|e| err.contains(e)), "{err}");
    }

    // A language-model run is not a translation run.
    std::fs::create_dir_all(dir.join("lm")).unwrap();
    std::fs::write(dir.join("lm/vocab.txt"), "<unk>\n").unwrap();
    let err = transformer_runtime::load::load_run(
        &dir.join("lm"),
        &transformer_runtime::load::Execution::on(&candle_core::Device::Cpu),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("language-model run"), "{err}");
}

/// The weight average is a read-out: the same step losses with and without it; both sets of
/// weights are validated every epoch, and the best model is the one with the higher
/// validation BLEU.
#[test]
fn weight_average_is_a_read_out() {
    let dir = corpus_dir("average");
    // The same run with the weight average and without it, each into its own folder.
    let [with, without] = [("with", 0.99), ("without", 0.0)].map(|(out, average_decay)| {
        let cfg = MtTrainConfig {
            epochs: 4,
            average_decay,
            ..small_config(&dir)
        };
        mt::train(&opts(&cfg, &dir.join(out), false, None), &mut Quiet).unwrap()
    });
    assert_eq!(with.step_losses, without.step_losses);

    let valid: Vec<(usize, Weights, f64)> = metrics::read(&dir.join("with/metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            Metric::Valid {
                epoch,
                weights,
                scores: Scores { bleu, .. },
                ..
            } => Some((epoch, weights, bleu.unwrap())),
            _ => None,
        })
        .collect();
    assert_eq!(
        valid.len(),
        8,
        "both weights validated every epoch: {valid:?}"
    );
    let best = valid
        .iter()
        .fold(None::<&(usize, Weights, f64)>, |b, v| match b {
            Some(b) if b.2 >= v.2 => Some(b),
            _ => Some(v),
        })
        .unwrap();
    assert_eq!(
        (with.state.best_epoch, with.state.best_weights),
        (best.0, best.1)
    );
    // Without an average only the trained weights are validated.
    let n = metrics::read(&dir.join("without/metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|m| matches!(m, Metric::Valid { .. }))
        .count();
    assert_eq!(n, 4);
}

#[test]
fn recurrent_baselines_train_translate_and_resume_exactly() {
    let dir = corpus_dir("rnn");
    for arch in [
        transformer_runtime::model::Arch::Gru,
        transformer_runtime::model::Arch::GruDot,
        transformer_runtime::model::Arch::GruBahdanau,
    ] {
        let cfg = MtTrainConfig {
            arch,
            rnn_hidden: 32,
            lr_factor: 0.3,
            ..small_config(&dir)
        };
        let run = dir.join(arch.name());
        let whole = mt::train(&opts(&cfg, &run, false, None), &mut Quiet).unwrap();
        let losses = &whole.step_losses;
        let (test_loss, test_bleu) = whole.test.unwrap();
        eprintln!(
            "{arch:?}: loss {} -> {}, test loss {test_loss}, BLEU {test_bleu}",
            losses[0],
            losses.last().unwrap()
        );
        assert!(
            losses.last().unwrap() < &(losses[0] * 0.6),
            "{arch:?}: the loss did not fall: {} -> {}",
            losses[0],
            losses.last().unwrap()
        );
        // The run directory holds what translating needs, under the model's architecture.
        let loaded = transformer_runtime::load::load_run(
            &run,
            &transformer_runtime::load::Execution::on(&candle_core::Device::Cpu),
        )
        .unwrap();
        assert!(loaded.model.recurrent().is_some(), "{arch:?}");
        // Its attention over the source, one row per output token, for pictures.
        let sentence = std::fs::read_to_string(dir.join("test.de")).unwrap();
        let sentence = sentence.lines().next().unwrap();
        let greedy = loaded.config.decode_options(1);
        let set = transformer_runtime::attention::attention_set(
            &loaded,
            sentence,
            &greedy,
            &candle_core::Device::Cpu,
        );
        if arch == transformer_runtime::model::Arch::Gru {
            let err = set.unwrap_err().to_string();
            assert!(err.contains("no attention"), "{err}");
        } else {
            let set = set.unwrap();
            assert_eq!(set.cross.len(), 1);
            let rows = &set.cross[0][0];
            assert_eq!(rows.len(), set.tgt_out_tokens.len());
            for r in rows {
                assert_eq!(r.len(), set.src_tokens.len());
                assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-4);
            }
            assert!(set.encoder.is_empty() && set.decoder.is_empty());
        }
        if arch == transformer_runtime::model::Arch::GruBahdanau {
            assert!(test_bleu > 10.0, "{arch:?}: test BLEU {test_bleu}");
            // Stopped mid-epoch and resumed: the same losses, bit for bit.
            let out = dir.join("rnn-parts");
            let mut parts = Vec::new();
            for (resume, stop) in [(false, Some(13)), (true, None)] {
                let s = mt::train(&opts(&cfg, &out, resume, stop), &mut Quiet).unwrap();
                parts.extend(s.step_losses);
            }
            assert_eq!(&parts, losses);
            assert_eq!(
                std::fs::read_to_string(run.join("test.hyp")).unwrap(),
                std::fs::read_to_string(out.join("test.hyp")).unwrap()
            );
        }
    }
}

/// Records every log line.
struct Lines(Vec<String>);
impl Progress for Lines {
    fn line(&mut self, l: &str) {
        self.0.push(l.to_string());
    }
}

/// Into Korean the best model is chosen by chrF: validation and test records carry chrF (and
/// the test BLEU beside it), the log names it, and the best model is the epoch with the
/// highest validation chrF; into other languages by BLEU, as before.
#[test]
fn korean_output_is_chosen_by_chrf() {
    let dir = corpus_dir("chrf");
    let cfg = MtTrainConfig {
        epochs: 3,
        average_decay: 0.0,
        src_lang: Some("de".into()),
        tgt_lang: Some("ko".into()),
        ..small_config(&dir)
    };
    let out = dir.join("ko");
    let mut log = Lines(Vec::new());
    mt::train(&opts(&cfg, &out, false, None), &mut log).unwrap();
    let records = metrics::read(&out.join("metrics.jsonl")).unwrap();
    let valid: Vec<(usize, f64)> = records
        .iter()
        .filter_map(|m| match m {
            Metric::Valid {
                epoch,
                scores:
                    Scores {
                        bleu: None,
                        chrf: Some(c),
                    },
                weights: Weights::Sgd,
                ..
            } => Some((*epoch, *c)),
            _ => None,
        })
        .collect();
    assert_eq!(valid.len(), 3, "{records:?}");
    let best = valid
        .iter()
        .copied()
        .fold((0, f64::MIN), |b, v| if v.1 > b.1 { v } else { b });
    assert!(
        log.0.iter().any(|l| l.contains("valid chrF")),
        "{:?}",
        log.0
    );
    assert!(
        log.0
            .iter()
            .any(|l| l.contains(&format!("of epoch {}", best.0)) && l.contains("test BLEU")),
        "the best epoch by chrF is {}: {:?}",
        best.0,
        log.0
    );
    assert!(records.iter().any(|m| matches!(
        m,
        Metric::Test {
            scores: Scores {
                bleu: Some(_),
                chrf: Some(_),
            },
            ..
        }
    )));

    // Into English: BLEU, no chrF.
    let en = MtTrainConfig {
        epochs: 1,
        tgt_lang: Some("en".into()),
        ..cfg
    };
    mt::train(&opts(&en, &dir.join("en"), false, None), &mut Quiet).unwrap();
    let records = metrics::read(&dir.join("en/metrics.jsonl")).unwrap();
    assert!(records.iter().any(|m| matches!(
        m,
        Metric::Valid {
            scores: Scores {
                bleu: Some(_),
                chrf: None,
            },
            ..
        }
    )));
    let _ = std::fs::remove_dir_all(&dir);
}
