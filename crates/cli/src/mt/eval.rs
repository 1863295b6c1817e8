//! `transformer mt eval`: translate sets and score them (sacreBLEU's BLEU and chrF).

use super::{load, translate_with_bar, DecodeArgs};
use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use transformer_runtime::config::{Corpus, MtTrainConfig};
use transformer_runtime::load::LoadedMt;
use transformer_text::parallel::read_lines;
use transformer_text::score::bleu::{corpus_bleu, BleuOptions};
use transformer_text::score::chrf::{corpus_chrf, ChrfOptions};
use transformer_train::mt::{self, CorpusSources};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer mt eval --run runs/de-en --src test.de --ref test.en --beam 5 --json\n  \
                  transformer mt eval --run runs/de-en --test-set test\n  \
                  transformer mt eval --run runs/ko-en-all --test-set all --hyp-out runs/ko-en-all/hyps"
)]
pub struct EvalArgs {
    #[command(flatten)]
    pub(super) decode: DecodeArgs,
    /// Source sentences, one per line (.gz read as gzip); with --ref, instead of --test-set.
    #[arg(long, requires = "reference", conflicts_with = "test_set")]
    src: Option<PathBuf>,
    /// Reference translations, line i translating line i of --src.
    #[arg(long = "ref", requires = "src")]
    reference: Option<PathBuf>,
    /// A set the run names, in the run's direction: valid, test, or for a ko-en-all run
    /// news-v1-test, ntrex128, tatoeba-heldout, python-docs-heldout, lo-help-heldout,
    /// lo-ui-heldout; `all` for every one. Repeat it for several.
    #[arg(long, required_unless_present = "src")]
    test_set: Vec<String>,
    /// Name the sets of this bundled corpus instead of the run's own (with --test-set), in
    /// the run's direction: for a run fine-tuned on files, `--corpus ko-en-all` scores it on
    /// ko-en-all's held-out sets.
    #[arg(long)]
    corpus: Option<Corpus>,
    /// The folder holding the bundled corpora, where it is not the one the run recorded
    /// (with --test-set).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Also write the translations: to this file for one set; into this folder for several,
    /// as NAME.hyp beside the set's sources and references (NAME.src, NAME.ref, in the run's
    /// direction), line i of each the same sentence.
    #[arg(long)]
    hyp_out: Option<PathBuf>,
    /// Print one JSON object per set.
    #[arg(long)]
    json: bool,
    /// Cut each source line into its sentences, translate them as one batch and join them
    /// back (as `mt translate` does by default); without it each line is one sentence to
    /// the model, as test sets of single sentences are scored.
    #[arg(long)]
    split_sentences: bool,
}

/// One set to score: its name (as the run names it, or the --src file), sources and
/// references.
struct EvalSet {
    name: String,
    src: Vec<String>,
    refs: Vec<String>,
}

/// The sets `mt eval` scores: --src/--ref, or the named sets of the run's configuration.
fn eval_sets(args: &EvalArgs, config: &MtTrainConfig) -> Result<Vec<EvalSet>> {
    if let (Some(src), Some(reference)) = (&args.src, &args.reference) {
        let s = read_lines(src).context("--src")?;
        let refs = read_lines(reference).context("--ref")?;
        if s.len() != refs.len() {
            bail!(
                "{} has {} lines but {} has {}: line i of the references must translate line i of the source",
                src.display(),
                s.len(),
                reference.display(),
                refs.len()
            );
        }
        return Ok(vec![EvalSet {
            name: src.display().to_string(),
            src: s,
            refs,
        }]);
    }
    let mut config = config.clone();
    if let Some(c) = args.corpus {
        config.corpus = Some(c);
        for p in [
            &mut config.valid_src,
            &mut config.valid_tgt,
            &mut config.test_src,
            &mut config.test_tgt,
        ] {
            *p = None;
        }
    }
    if args.data.is_some() {
        config.data.clone_from(&args.data);
    }
    let named = config.eval_sets()?;
    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    let mut out = Vec::new();
    for want in &args.test_set {
        let chosen: Vec<&(String, transformer_text::parallel::PairSource)> = if want == "all" {
            named.iter().collect()
        } else {
            match named.iter().find(|(n, _)| n == want) {
                Some(set) => vec![set],
                None => bail!(
                    "--test-set {want:?}: this run names {} (or all)",
                    names.join(", ")
                ),
            }
        };
        for (name, source) in chosen {
            if out.iter().any(|s: &EvalSet| &s.name == name) {
                continue;
            }
            let pairs = source
                .read()
                .with_context(|| format!("--test-set {name}: cannot read its files; pass --data DIR (the folder holding multi30k/ and ko-en/) if they moved"))?;
            out.push(EvalSet {
                name: name.clone(),
                src: pairs.src,
                refs: pairs.tgt,
            });
        }
    }
    Ok(out)
}

/// `mt eval`: every set asked for, translated and scored in turn.
pub(super) fn run(args: &EvalArgs, device: &Device) -> Result<()> {
    let (run, opts) = load(&args.decode, device)?;
    let sets = eval_sets(args, &run.config)?;
    // The output files are checked before any translating.
    let hyp_paths: Vec<Option<PathBuf>> = match &args.hyp_out {
        None => vec![None; sets.len()],
        Some(p) if sets.len() == 1 => {
            if p.is_dir() {
                bail!("--hyp-out {} is a directory: name a file", p.display())
            }
            vec![Some(p.clone())]
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--hyp-out {}: cannot make this folder", dir.display()))?;
            sets.iter()
                .map(|s| Some(dir.join(format!("{}.hyp", s.name))))
                .collect()
        }
    };
    for p in hyp_paths.iter().flatten() {
        std::fs::File::create(p)
            .with_context(|| format!("--hyp-out {}: cannot write it", p.display()))?;
    }
    for set in &sets {
        if set.src.iter().all(|l| l.is_empty()) {
            bail!(
                "{}: nothing to score: it has no sentences ({} lines, all empty); a score of \
                 an empty set would mean nothing",
                set.name,
                set.src.len()
            );
        }
    }
    let korean_output = run.config.language_pair().is_some_and(|(_, t)| t == "ko");
    for (set, hyp_path) in sets.iter().zip(&hyp_paths) {
        if sets.len() > 1 && !args.json {
            println!("== {} ({} sentences)", set.name, set.src.len());
        }
        let t = Instant::now();
        let hyps = translate_with_bar(&run, &set.src, args.split_sentences, &opts, device)?;
        let secs = t.elapsed().as_secs_f64();
        if let Some(p) = hyp_path {
            let write = |p: &std::path::Path, lines: &[String]| {
                std::fs::write(p, lines.join("\n") + "\n")
                    .with_context(|| format!("--hyp-out {}: cannot write it", p.display()))
            };
            write(p, &hyps)?;
            if sets.len() > 1 {
                write(&p.with_extension("src"), &set.src)?;
                write(&p.with_extension("ref"), &set.refs)?;
            }
        }
        score_set(
            &run,
            set,
            &hyps,
            secs,
            opts.beam,
            korean_output,
            args,
            device,
        )?;
    }
    Ok(())
}

/// Scores one set's translations and prints the scores (text, or one JSON object).
#[allow(clippy::too_many_arguments)]
fn score_set(
    run: &LoadedMt,
    set: &EvalSet,
    hyps: &[String],
    secs: f64,
    beam: usize,
    korean_output: bool,
    args: &EvalArgs,
    device: &Device,
) -> Result<()> {
    let (src, refs) = (&set.src, &set.refs);
    let data = mt::EncodedSplit::encode(
        transformer_text::parallel::Pairs {
            src: src.clone(),
            tgt: refs.clone(),
        },
        &run.tokenizer,
    );
    let loss = mt::evaluate_loss(&run.model, &data, run.config.max_tokens, device)?;
    let word_ppl = mt::word_perplexity(loss, &data);
    let b = corpus_bleu(hyps, refs, &BleuOptions::default())?;
    let c = corpus_chrf(hyps, refs, &ChrfOptions::default())?;
    let lc = corpus_bleu(hyps, refs, &BleuOptions::lowercased_tokens())?;
    // BLEU on Korean depends on the tokenizer (13a splits at spaces, and Korean words carry
    // their particles); sacreBLEU's `char` tokenization is reported beside it.
    let char_opts = BleuOptions {
        tokenizer: transformer_text::score::tokenizers::Tokenizer::Char,
        ..BleuOptions::default()
    };
    let bc = corpus_bleu(hyps, refs, &char_opts)?;
    if args.json {
        let obj = serde_json::json!({
            "set": set.name,
            "bleu": b.score,
            "signature": b.signature(),
            "precisions": b.precisions,
            "bp": b.bp,
            "sys_len": b.sys_len,
            "ref_len": b.ref_len,
            "chrf": c.score,
            "chrf_signature": c.signature(),
            "bleu_char": bc.score,
            "bleu_char_signature": bc.signature(),
            "lowercased_token_bleu": lc.score,
            "lowercased_token_bleu_label": lc.options.label(),
            "sentences": src.len(),
            "loss": loss,
            "ppl": loss.exp(),
            "word_ppl": word_ppl,
            "beam": beam,
            "seconds": secs,
        });
        println!("{obj}");
        return Ok(());
    }
    if korean_output {
        println!(
            "{} (the primary score for Korean output)",
            c.format_with_signature()
        );
        println!("{}", b.format_with_signature());
        println!("{}", bc.format_with_signature());
    } else {
        println!("{}", b.format_with_signature());
        println!("{}", c.format_with_signature());
    }
    println!("{}: {:.2}", lc.options.label(), lc.score);
    println!(
        "loss {loss:.4} per subword token, perplexity {:.2} (per word: {word_ppl:.2})",
        loss.exp()
    );
    println!(
        "{} sentences, beam {beam}, {secs:.1}s ({:.1} sentences/s)",
        src.len(),
        src.len() as f64 / secs.max(1e-9)
    );
    Ok(())
}
