//! Multi-head attention (section 3.2.2):
//! `MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`,
//! `head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`.
//!
//! One `(C, C)` projection each for queries, keys and values, split into H heads of D = C/H
//! dimensions (equivalent to h separate `(C, D)` projections). The pieces are public so that
//! cross-attention can project the encoder memory once per source sentence and decoding can
//! append to cached keys and values.

use crate::attention::{attention_output, scaled_dot_product_attention, AttentionInputs, Qkv};
use crate::dropout::{Dropout, Mode};
use crate::linear::Linear;
use crate::mask::Mask;
use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::Tensor;

/// The projected keys and values of every position a self-attention layer has seen, so each
/// decoding step projects only its new tokens. Passed explicitly (`&mut`) to the forward that
/// uses it; a module never holds one.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// (B, H, S, D) each, `None` before the first step.
    kv: Option<(Tensor, Tensor)>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    /// True before the first step (no position cached).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the rows `rows` (in that order, repeats allowed) of every cached tensor: how a
    /// beam search follows each surviving hypothesis back to its parent.
    ///
    /// # Shapes
    /// (B, H, S, D) each, rows (B',) u32 -> (B', H, S, D) each
    pub fn select_rows(&mut self, rows: &Tensor) -> Result<()> {
        if let Some((k, v)) = self.kv.take() {
            self.kv = Some((k.index_select(rows, 0)?, v.index_select(rows, 0)?));
        }
        Ok(())
    }

    /// Appends new keys and values and returns all of them.
    ///
    /// # Shapes
    /// (B, H, T, D) each -> (B, H, S + T, D) each
    pub fn append(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let kv = match self.kv.take() {
            None => (k, v),
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
        };
        self.kv = Some(kv.clone());
        Ok(kv)
    }
}

/// Multi-head attention with separate query, key, value and output projections (C, C)
/// and H heads of D = C / H dimensions; dropout on the attention weights.
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    nhead: usize,
    dropout: Dropout,
}

impl MultiHeadAttention {
    /// PyTorch's `nn.MultiheadAttention` initialisation: Xavier-uniform over the packed
    /// `(3C, C)` input projection, zero input and output biases, default `Linear` init for
    /// the output weight. `dropout` acts on the attention weights.
    pub fn new(
        pb: &ParamBuilder,
        d_model: usize,
        nhead: usize,
        dropout: f64,
        bias: bool,
    ) -> Result<Self> {
        if nhead == 0 || !d_model.is_multiple_of(nhead) {
            candle_core::bail!("d_model {d_model} is not divisible by nhead {nhead}");
        }
        let packed = Init::XavierUniform {
            fan_in: d_model,
            fan_out: 3 * d_model,
        };
        let bias_init = bias.then_some(Init::Zeros);
        let proj = |name| Linear::with_init(&pb.pp(name), d_model, d_model, packed, bias_init);
        Ok(Self {
            q_proj: proj("q_proj")?,
            k_proj: proj("k_proj")?,
            v_proj: proj("v_proj")?,
            out_proj: Linear::with_init(
                &pb.pp("out_proj"),
                d_model,
                d_model,
                Init::torch_linear(d_model),
                bias_init,
            )?,
            nhead,
            dropout: Dropout::new(dropout),
        })
    }

    /// The number of heads H.
    pub fn nhead(&self) -> usize {
        self.nhead
    }

    /// The query, key, value and output projections, in that order.
    pub(crate) fn projections(&self) -> [&Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.out_proj]
    }

    /// The dropout on the attention weights.
    pub(crate) fn dropout(&self) -> Dropout {
        self.dropout
    }

    /// Splits the last dimension into H heads of D and moves the heads before the positions.
    ///
    /// # Shapes
    /// (B, T, C) -> (B, H, T, D)
    pub fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        // (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
        x.reshape((b, t, self.nhead, c / self.nhead))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// Projects and splits queries.
    ///
    /// # Shapes
    /// (B, T, C) -> (B, H, T, D)
    pub fn project_q(&self, query: &Tensor) -> Result<Tensor> {
        self.split_heads(&self.q_proj.forward(query)?)
    }

    /// Projects and splits keys and values (once per source sentence for cross-attention).
    ///
    /// # Shapes
    /// (B, S, C), (B, S, C) -> (B, H, S, D), (B, H, S, D)
    pub fn project_kv(&self, key: &Tensor, value: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.split_heads(&self.k_proj.forward(key)?)?,
            self.split_heads(&self.v_proj.forward(value)?)?,
        ))
    }

    /// Attention over already projected heads, then the output projection.
    ///
    /// # Shapes
    /// q (B, H, T, D), k (B, H, S, D), v (B, H, S, D) -> out (B, T, C), weights (B, H, T, S)
    pub fn attend(&self, qkv: Qkv, mask: Option<&Mask>, mode: Mode) -> Result<(Tensor, Tensor)> {
        let (out, weights) = scaled_dot_product_attention(self.inputs(qkv, mask, mode))?;
        Ok((self.merge_heads_and_project(&out)?, weights))
    }

    /// The self-attention sub-layer of the encoder and decoder layers: `x` over itself (and
    /// over `cache` when given, which is extended with `x`'s keys and values), with the
    /// attention weights (B, H, T, S + T) only when `need_weights` asks for them (without
    /// them, the fused attention op, [`attention_output`], which keeps nothing of them).
    ///
    /// # Shapes
    /// x (B, T, C) -> (B, T, C) and the weights
    pub fn self_attention(
        &self,
        x: &Tensor,
        cache: Option<&mut KvCache>,
        mask: Option<&Mask>,
        mode: Mode,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if !need_weights {
            let q = self.project_q(x)?;
            let (k, v) = self.project_kv(x, x)?;
            let (k, v) = match cache {
                Some(cache) => cache.append(k, v)?,
                None => (k, v),
            };
            let (q, k, v) = (&q, &k, &v);
            return Ok((self.fused_output(Qkv { q, k, v }, mask, mode)?, None));
        }
        let (out, w) = match cache {
            Some(cache) => self.forward_cached(x, cache, mask, mode)?,
            None => self.forward(x, x, x, mask, mode)?,
        };
        Ok((out, Some(w)))
    }

    /// Attention of `query` over `memory` (encoder-decoder attention) without the weights:
    /// the fused attention op ([`attention_output`]).
    ///
    /// # Shapes
    /// query (B, T, C), memory (B, S, C) -> (B, T, C)
    pub fn cross_attention_output(
        &self,
        query: &Tensor,
        memory: &Tensor,
        mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<Tensor> {
        let q = self.project_q(query)?;
        let (k, v) = self.project_kv(memory, memory)?;
        let (q, k, v) = (&q, &k, &v);
        self.fused_output(Qkv { q, k, v }, mask, mode)
    }

    /// Attention over already projected heads through the fused attention op
    /// ([`attention_output`], which keeps no weights), then the output projection.
    fn fused_output(&self, qkv: Qkv, mask: Option<&Mask>, mode: Mode) -> Result<Tensor> {
        let out = attention_output(self.inputs(qkv, mask, mode))?;
        self.merge_heads_and_project(&out)
    }

    /// Heads `qkv` to attend with under `mask`, with this module's dropout.
    fn inputs<'a>(
        &self,
        qkv: Qkv<'a>,
        mask: Option<&'a Mask>,
        mode: Mode<'a>,
    ) -> AttentionInputs<'a> {
        AttentionInputs {
            qkv,
            mask,
            dropout: self.dropout,
            mode,
        }
    }

    /// # Shapes
    /// (B, H, T, D) -> (B, T, C)
    fn merge_heads_and_project(&self, out: &Tensor) -> Result<Tensor> {
        let (b, h, t, d) = out.dims4()?;
        // (B, H, T, D) -> (B, T, H, D) -> (B, T, C)
        let out = out.transpose(1, 2)?.contiguous()?.reshape((b, t, h * d))?;
        self.out_proj.forward(&out)
    }

    /// Self-attention of new positions over themselves and everything in `cache`, which is
    /// extended with their keys and values. `mask` covers all keys: (T, S + T).
    ///
    /// # Shapes
    /// x (B, T, C) -> out (B, T, C), weights (B, H, T, S + T)
    pub fn forward_cached(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, Tensor)> {
        let q = self.project_q(x)?;
        let (k, v) = self.project_kv(x, x)?;
        let (k, v) = cache.append(k, v)?;
        let (q, k, v) = (&q, &k, &v);
        self.attend(Qkv { q, k, v }, mask, mode)
    }

    /// Full multi-head attention of `query` over `key`/`value`.
    ///
    /// # Shapes
    /// query (B, T, C), key (B, S, C), value (B, S, C), mask broadcastable to (B, H, T, S)
    /// -> out (B, T, C), weights (B, H, T, S)
    pub fn forward(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, Tensor)> {
        let (b, _t, c) = query.dims3()?;
        let (kb, s, kc) = key.dims3()?;
        if (kb, kc) != (b, c) || value.dims3()? != (b, s, c) {
            candle_core::bail!(
                "multi-head attention: query {:?}, key {:?} and value {:?} must be (B, T, C), \
                 (B, S, C), (B, S, C)",
                query.dims(),
                key.dims(),
                value.dims()
            );
        }
        let q = self.project_q(query)?;
        let (k, v) = self.project_kv(key, value)?;
        let (q, k, v) = (&q, &k, &v);
        self.attend(Qkv { q, k, v }, mask, mode)
    }
}
