//! Using trained translation models, apart from training them: what `transformer serve`,
//! `mt translate`, `mt eval`, `mt attention` and `mt quantize` stand on, and what training
//! uses to decode its validation and test sets.
//!
//! - [`run_dir`] and [`checkpoint`]: a run directory's files, and the checksummed, tagged
//!   tensor files its weights are;
//! - [`config`]: the run's `config.toml` ([`config::MtTrainConfig`]): the model, how it
//!   decodes, which languages it translates;
//! - [`model`]: the architectures behind one type ([`model::MtModel`]), and their registry
//!   ([`model::MtModelConfig::arch`]);
//! - [`load`]: a run loaded with its tokenizer ([`load::load_run`]);
//! - [`translate`]: the one entry point for decoding requests ([`translate::translate`],
//!   options in [`translate::DecodeRequest`]);
//! - [`quantize`], [`vocab_map`]: int8 weights, and restricted output vocabularies;
//! - [`attention`] and [`viz`]: the attention weights of a translation, and their pictures.
//!
//! # Example
//! A model of the default configuration, untrained, decoding one sentence greedily:
//!
//! ```
//! use candle_core::{DType, Device};
//! use transformer_model::ParamBuilder;
//! use transformer_runtime::config::MtTrainConfig;
//! use transformer_runtime::model::MtModel;
//! use transformer_runtime::translate::{translate, DecodeRequest};
//!
//! let config = MtTrainConfig { d_model: 32, nhead: 4, dim_feedforward: 64, ..Default::default() };
//! let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 7);
//! let model = MtModel::build(&pb, &config.model_config(100))?;
//! let request = DecodeRequest::new(config.decode_options(1));
//! let out = translate(&model.decoder()?, &[vec![5, 6, 7]], &request, &Device::Cpu, |_, _| {})?;
//! assert_eq!(out.len(), 1); // one n-best list per source
//! assert!(out[0][0].tokens.len() <= 1024);
//! # Ok::<(), transformer_runtime::Error>(())
//! ```

#![warn(missing_docs)]

pub mod attention;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod import;
pub mod int8_weights;
pub mod load;
pub mod model;
pub mod quantize;
pub mod run_dir;
pub mod translate;
pub mod viz;
pub mod vocab_map;

pub use error::{Error, Result};
