//! `transformer bleu`: corpus BLEU and chrF of a hypothesis file against a reference file,
//! exactly as sacreBLEU computes them (`transformer_text::score`), plus the lowercased-token
//! BLEU of the PyTorch translation tutorial's published scores, labelled as such.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use transformer_text::score::{
    self, corpus_bleu, corpus_chrf, BleuOptions, ChrfOptions, Smoothing, Tokenizer,
};

/// Arguments of `transformer bleu`.
#[derive(clap::Args)]
#[command(
    after_help = "Prints three lines: BLEU with its sacreBLEU signature, chrF2 with its \
                  signature, and the lowercased-token BLEU (lowercase, 13a tokens, no smoothing: \
                  the convention of torchtext's bleu_score behind the PyTorch translation \
                  tutorial's published scores), labelled as such.\n\n\
                  Examples:\n  \
                  transformer bleu --hyp runs/mt/test.hyp --ref ../shared/data/multi30k/task1/raw/test_2016_flickr.en.gz\n  \
                  transformer bleu --hyp out.txt --ref ref.txt --tokenize intl --json\n\n\
                  The first two lines are those of \
                  `sacrebleu ref.txt -i out.txt -m bleu chrf -w 2 -f text` (without its \
                  alignment spaces)."
)]
pub struct BleuArgs {
    /// Hypotheses (system output), UTF-8, one segment per line.
    #[arg(long, value_name = "FILE")]
    hyp: PathBuf,
    /// References, UTF-8, one per line: line i translates the same source as line i of --hyp.
    #[arg(long = "ref", value_name = "FILE")]
    reference: PathBuf,
    /// BLEU's tokenizer (sacreBLEU's -tok).
    #[arg(long, value_enum, default_value_t = TokenizeArg::V13a)]
    tokenize: TokenizeArg,
    /// Lowercase hypotheses and references before BLEU (sacreBLEU's -lc).
    #[arg(long)]
    lowercase: bool,
    /// BLEU's smoothing for n-gram orders without matches (sacreBLEU's -s).
    #[arg(long, value_enum, default_value_t = SmoothArg::Exp)]
    smooth: SmoothArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `--tokenize` values (sacreBLEU's names).
#[derive(Clone, Copy, ValueEnum)]
enum TokenizeArg {
    /// mteval-v13a, WMT's standard and sacreBLEU's default.
    #[value(name = "13a")]
    V13a,
    /// mteval-v14 international: splits Unicode punctuation and symbols.
    Intl,
    /// Every character is a token.
    Char,
    /// Whitespace-separated words as they are.
    None,
}

impl From<TokenizeArg> for Tokenizer {
    fn from(t: TokenizeArg) -> Self {
        match t {
            TokenizeArg::V13a => Tokenizer::V13a,
            TokenizeArg::Intl => Tokenizer::Intl,
            TokenizeArg::Char => Tokenizer::Char,
            TokenizeArg::None => Tokenizer::None,
        }
    }
}

/// `--smooth` values (sacreBLEU's names and default values).
#[derive(Clone, Copy, ValueEnum)]
enum SmoothArg {
    /// mteval-v13a's exponential smoothing (sacreBLEU's default).
    Exp,
    /// No smoothing: a missing order makes BLEU 0.
    None,
    /// Floor of 0.1 matches for an order without any.
    Floor,
    /// Add 1 to the matches and totals of orders 2 to 4.
    #[value(name = "add-k")]
    AddK,
}

impl From<SmoothArg> for Smoothing {
    fn from(s: SmoothArg) -> Self {
        match s {
            SmoothArg::Exp => Smoothing::Exp,
            SmoothArg::None => Smoothing::None,
            SmoothArg::Floor => Smoothing::Floor(Smoothing::FLOOR_DEFAULT),
            SmoothArg::AddK => Smoothing::AddK(Smoothing::ADD_K_DEFAULT),
        }
    }
}

/// A file's lines as the sacreBLEU command line reads them (split on "\n", right-stripped).
fn read_segments(path: &Path, flag: &str) -> Result<Vec<String>> {
    // `.gz` files (as Multi30k is distributed) are decompressed.
    let bytes = transformer_text::parallel::read_bytes(path).with_context(|| {
        format!(
            "cannot read the {flag} file {}: check the path (one segment per line, UTF-8)",
            path.display()
        )
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the {flag} file {} is not UTF-8 (invalid byte at offset {}): convert it, e.g. \
             `iconv -f LATIN1 -t UTF-8 {} > fixed.txt`",
            path.display(),
            e.utf8_error().valid_up_to(),
            path.display()
        )
    })?;
    Ok(score::read_lines(&text))
}

/// Runs `transformer bleu`.
pub fn run(args: BleuArgs) -> Result<()> {
    let hyps = read_segments(&args.hyp, "--hyp")?;
    let refs = read_segments(&args.reference, "--ref")?;
    if hyps.len() != refs.len() {
        bail!(
            "--hyp {} has {} lines but --ref {} has {} lines: the files must pair up line by \
             line (one hypothesis per reference, same order); check that both come from the same \
             test set and that neither has lost or gained lines",
            args.hyp.display(),
            hyps.len(),
            args.reference.display(),
            refs.len()
        );
    }
    // sacreBLEU's warning for hypotheses that still look tokenized.
    let tokenized = hyps.iter().filter(|h| h.ends_with(" .")).count();
    if tokenized >= 100 {
        eprintln!(
            "warning: {tokenized} lines of {} end in a tokenized period (' .'): BLEU expects \
             detokenized text, and tokenized input lowers the score",
            args.hyp.display()
        );
    }

    let opts = BleuOptions {
        tokenizer: args.tokenize.into(),
        lowercase: args.lowercase,
        smoothing: args.smooth.into(),
        ..BleuOptions::default()
    };
    let bleu = corpus_bleu(&hyps, &refs, &opts)?;
    let chrf = corpus_chrf(&hyps, &refs, &ChrfOptions::default())?;
    let lc = corpus_bleu(&hyps, &refs, &BleuOptions::lowercased_tokens())?;

    if args.json {
        let out = serde_json::json!({
            "score": bleu.score,
            "precisions": bleu.precisions,
            "counts": bleu.counts,
            "totals": bleu.totals,
            "bp": bleu.bp,
            "sys_len": bleu.sys_len,
            "ref_len": bleu.ref_len,
            "ratio": bleu.ratio,
            "signature": bleu.signature(),
            "line": bleu.format_with_signature(),
            "chrf": chrf.score,
            "chrf_signature": chrf.signature(),
            "chrf_line": chrf.format_with_signature(),
            "lowercased_token_bleu": lc.score,
            "lowercased_token_bleu_label": lc.options.label(),
            "lowercased_token_bleu_signature": lc.signature(),
            "lowercased_token_bleu_line": lc.format_with_signature(),
            "hyp": args.hyp.display().to_string(),
            "ref": args.reference.display().to_string(),
            "segments": hyps.len(),
        });
        print_lines(&[out.to_string()])
    } else {
        print_lines(&[
            bleu.format_with_signature(),
            chrf.format_with_signature(),
            lc.format_with_signature(),
        ])
    }
}

/// Prints `lines` to stdout; a closed pipe (`| head -1`) ends the output quietly.
fn print_lines(lines: &[String]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for line in lines {
        match writeln!(out, "{line}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r.context("writing to stdout")?,
        }
    }
    Ok(())
}
