//! `transformer import`: a published translation model (a CTranslate2 model directory, an
//! Argos Translate package, a Hugging Face MarianMT directory) as a run directory that every
//! command takes.

use anyhow::{Context, Result};
use std::path::PathBuf;
use transformer_runtime::import::Format;

/// Import a published translation model as a run directory.
#[derive(clap::Args)]
#[command(
    long_about = "Import a published translation model as a run directory, which `mt \
                  translate`, `mt eval`, `mt attention`, `mt quantize`, `serve`, `bench \
                  mt-decode` and `mt train --init-from` then take as they take a trained run.\n\n\
                  Formats (told by the files, or --format):\n  \
                  ctranslate2  a CTranslate2 model directory (model.bin of binary version 1 \
                  to 6, config.json, vocabularies); weights in float32, float16, bfloat16, \
                  int16 or int8 (an int8 model decodes in int8)\n  \
                  argos        an Argos Translate package (.argosmodel, or its unzipped \
                  folder): its CTranslate2 model, SentencePiece model and languages\n  \
                  marian       a Hugging Face MarianMT directory (OPUS-MT: config.json, \
                  model.safetensors or pytorch_model.bin, vocab.json, source.spm, target.spm)\n\n\
                  The run decodes as the model's engine does (CTranslate2's translate_batch: \
                  beam 2, or an Argos package's beam 4 and length penalty 0.2; MarianMT: \
                  generate() with its generation_config.json) unless options say otherwise. \
                  Whatever the reader does not support is an error that names the file and the \
                  feature; nothing is written then.",
    after_help = "Examples:\n  \
                  transformer import translate-de_en-1_9.argosmodel --out runs/argos-de-en\n  \
                  transformer import ende_ctranslate2/ --src-lang en --tgt-lang de --out runs/ct2-en-de\n  \
                  transformer import opus-mt-de-en/ --src-lang de --tgt-lang en --out runs/opus-de-en\n  \
                  echo 'Guten Morgen!' | transformer mt translate --run runs/argos-de-en"
)]
pub struct ImportArgs {
    /// The model: a CTranslate2 model directory, an Argos Translate package (.argosmodel file
    /// or unzipped folder), or a MarianMT directory.
    path: PathBuf,
    /// The run directory to write (must not exist, or be empty).
    #[arg(long)]
    out: PathBuf,
    /// The model's format, when its files do not tell it: ctranslate2, argos or marian.
    #[arg(long)]
    format: Option<Format>,
    /// The source language's code, for `serve` (an Argos package names its own).
    #[arg(long)]
    src_lang: Option<String>,
    /// The target language's code, for `serve`.
    #[arg(long)]
    tgt_lang: Option<String>,
}

pub fn run(args: ImportArgs) -> Result<()> {
    let format = match args.format {
        Some(f) => f,
        None => Format::detect(&args.path)?,
    };
    let mut imported = format
        .read(&args.path)
        .with_context(|| format!("importing {} as {}", args.path.display(), format.name()))?;
    if args.src_lang.is_some() || args.tgt_lang.is_some() {
        let (s, sn, t, tn) = imported.languages.clone().unwrap_or_default();
        let src = args.src_lang.clone().unwrap_or(s);
        let tgt = args.tgt_lang.clone().unwrap_or(t);
        anyhow::ensure!(
            !src.is_empty() && !tgt.is_empty(),
            "give both --src-lang and --tgt-lang (the model does not name its languages)"
        );
        let (sn, tn) = (
            if sn.is_empty() { src.clone() } else { sn },
            if tn.is_empty() { tgt.clone() } else { tn },
        );
        imported.languages = Some((src, sn, tgt, tn));
    }
    for note in &imported.notes {
        eprintln!("{note}");
    }
    let m = &imported.model;
    let t = &m.transformer;
    eprintln!(
        "model: {} + {} layers, d_model {}, {} heads, feed-forward {} ({:?}), {}, {} source and \
         {} target tokens{}",
        t.num_encoder_layers,
        t.num_decoder_layers,
        t.d_model,
        t.nhead,
        t.dim_feedforward,
        t.activation,
        if t.norm_first {
            "pre-norm"
        } else {
            "post-norm"
        },
        m.src_vocab,
        m.tgt_vocab,
        if m.share_embeddings {
            ", shared embeddings"
        } else {
            ""
        }
    );
    if let Some((s, sn, tl, tn)) = &imported.languages {
        eprintln!("languages: {sn} ({s}) to {tn} ({tl})");
    }
    imported.write_run(&args.out)?;
    eprintln!(
        "wrote {}: translate with `transformer mt translate --run {}`",
        args.out.display(),
        args.out.display()
    );
    Ok(())
}
