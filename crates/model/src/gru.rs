//! A gated recurrent unit (Cho et al. 2014), as `torch.nn.GRU` computes it, for the
//! recurrent encoder-decoders the Transformer replaced.
//!
//! For each direction of each layer, with `x_t` the input and `h` the previous state:
//!
//! ```text
//! r  = sigmoid(W_ir x_t + b_ir + W_hr h + b_hr)
//! z  = sigmoid(W_iz x_t + b_iz + W_hz h + b_hz)
//! n  = tanh(W_in x_t + b_in + r * (W_hn h + b_hn))
//! h' = (1 - z) * n + z * h
//! ```
//!
//! Parameters have PyTorch's names and layouts: `weight_ih_l{k}` (3H, I) and `weight_hh_l{k}`
//! (3H, H) stack the r, z and n rows in that order, `bias_ih_l{k}` and `bias_hh_l{k}` are (3H,),
//! and the reverse direction adds `_reverse`. All start as U(-1/sqrt(H), 1/sqrt(H)), PyTorch's
//! default.
//!
//! Padded batches: each row has a length, padding comes after it. A row's state stops changing
//! after its last token, and the reverse direction starts at its last token from the initial
//! state, so the outputs and final states are those of `pack_padded_sequence` in PyTorch;
//! outputs at padded positions are zero.
//!
//! Composed of candle primitives with a backward pass, and the fused element-wise `tanh` and
//! sigmoid of [`crate::kernels`]. The input projections of all time
//! steps are one product before the time loop; inside it, one (B, H) x (H, 3H) product and
//! the gates' element-wise ops per step.

use crate::dropout::{Dropout, Mode};
use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::{Tensor, D};

/// The logistic function (fused on the CPU: [`crate::ops::sigmoid`]).
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    crate::ops::sigmoid(x)
}

/// One direction of one layer.
#[derive(Debug, Clone)]
pub struct GruDirection {
    /// (3H, I)
    weight_ih: Tensor,
    /// (3H, H)
    weight_hh: Tensor,
    /// (3H,)
    bias_ih: Tensor,
    /// (3H,)
    bias_hh: Tensor,
    hidden: usize,
}

impl GruDirection {
    /// Parameters `weight_ih_l{layer}{suffix}` and so on, under `pb`'s prefix.
    pub fn new(
        pb: &ParamBuilder,
        layer: usize,
        suffix: &str,
        input: usize,
        hidden: usize,
    ) -> Result<Self> {
        let init = Init::Uniform(1.0 / (hidden as f64).sqrt());
        let name = |kind: &str| format!("{kind}_l{layer}{suffix}");
        Ok(Self {
            weight_ih: pb.var(&name("weight_ih"), (3 * hidden, input), init)?,
            weight_hh: pb.var(&name("weight_hh"), (3 * hidden, hidden), init)?,
            bias_ih: pb.var(&name("bias_ih"), 3 * hidden, init)?,
            bias_hh: pb.var(&name("bias_hh"), 3 * hidden, init)?,
            hidden,
        })
    }

    /// The input's share of the gates for every position at once.
    ///
    /// # Shapes
    /// x (B, T, I) -> (B, T, 3H)
    pub fn input_gates(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, i) = x.dims3()?;
        x.reshape((b * t, i))?
            .matmul(&self.weight_ih.t()?)?
            .broadcast_add(&self.bias_ih)?
            .reshape((b, t, 3 * self.hidden))
    }

    /// One step from the input's share of the gates.
    ///
    /// # Shapes
    /// gi (B, 3H), h (B, H) -> (B, H)
    pub fn cell(&self, gi: &Tensor, h: &Tensor) -> Result<Tensor> {
        let hs = self.hidden;
        let gh = h
            .matmul(&self.weight_hh.t()?)?
            .broadcast_add(&self.bias_hh)?;
        let r = sigmoid(&(gi.narrow(1, 0, hs)? + gh.narrow(1, 0, hs)?)?)?;
        let z = sigmoid(&(gi.narrow(1, hs, hs)? + gh.narrow(1, hs, hs)?)?)?;
        let n = crate::ops::tanh(&(gi.narrow(1, 2 * hs, hs)? + (r * gh.narrow(1, 2 * hs, hs)?)?)?)?;
        // (1 - z) n + z h = n + z (h - n)
        &n + (z * (h - &n)?)?
    }

    /// One step from the input itself (decoders feed one position at a time).
    ///
    /// # Shapes
    /// x (B, I), h (B, H) -> (B, H)
    pub fn step(&self, x: &Tensor, h: &Tensor) -> Result<Tensor> {
        let gi = x
            .matmul(&self.weight_ih.t()?)?
            .broadcast_add(&self.bias_ih)?;
        self.cell(&gi, h)
    }

    /// Runs over a padded batch, forward in time or reversed.
    ///
    /// # Shapes
    /// x (B, T, I), h0 (B, H), masks: T tensors (B, 1), 1 for tokens and 0 for padding ->
    /// (outputs (B, T, H), final state (B, H))
    fn run(
        &self,
        x: &Tensor,
        h0: &Tensor,
        masks: Option<&[Tensor]>,
        reverse: bool,
    ) -> Result<(Tensor, Tensor)> {
        let t_len = x.dim(1)?;
        let gates = self.input_gates(x)?;
        let mut h = h0.clone();
        let mut outs: Vec<Option<Tensor>> = vec![None; t_len];
        let order: Vec<usize> = if reverse {
            (0..t_len).rev().collect()
        } else {
            (0..t_len).collect()
        };
        for t in order {
            let gi = gates.narrow(1, t, 1)?.squeeze(1)?;
            let next = self.cell(&gi, &h)?;
            match masks {
                // Padding keeps the state (forward: the last token's; reverse: h0) and
                // outputs zero.
                Some(m) => {
                    let m = &m[t];
                    h = (&h + m.broadcast_mul(&(&next - &h)?)?)?;
                    outs[t] = Some(next.broadcast_mul(m)?);
                }
                None => {
                    outs[t] = Some(next.clone());
                    h = next;
                }
            }
        }
        let outs: Vec<Tensor> = outs.into_iter().map(|o| o.expect("every step")).collect();
        Ok((Tensor::stack(&outs, 1)?, h))
    }
}

/// A stack of GRU layers, one or two directions each, batch-first (`torch.nn.GRU(...,
/// batch_first=True)`).
#[derive(Debug, Clone)]
pub struct Gru {
    /// Per layer: the forward direction, and the reverse one when bidirectional.
    layers: Vec<(GruDirection, Option<GruDirection>)>,
    hidden: usize,
    dropout: Dropout,
}

impl Gru {
    /// `num_layers` layers of `hidden` units; `dropout` acts on each layer's output except
    /// the last, in training (PyTorch's `dropout` argument).
    pub fn new(
        pb: &ParamBuilder,
        input: usize,
        hidden: usize,
        num_layers: usize,
        bidirectional: bool,
        dropout: f64,
    ) -> Result<Self> {
        let dirs = if bidirectional { 2 } else { 1 };
        let mut layers = Vec::with_capacity(num_layers);
        for l in 0..num_layers {
            let in_dim = if l == 0 { input } else { dirs * hidden };
            let fwd = GruDirection::new(pb, l, "", in_dim, hidden)?;
            let rev = if bidirectional {
                Some(GruDirection::new(pb, l, "_reverse", in_dim, hidden)?)
            } else {
                None
            };
            layers.push((fwd, rev));
        }
        Ok(Self {
            layers,
            hidden,
            dropout: Dropout::new(dropout),
        })
    }

    /// Hidden units per direction.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Directions per layer (1 or 2).
    pub fn directions(&self) -> usize {
        if self.layers.first().is_some_and(|l| l.1.is_some()) {
            2
        } else {
            1
        }
    }

    /// The first layer's forward direction (a one-layer decoder steps with it).
    pub fn first(&self) -> &GruDirection {
        &self.layers[0].0
    }

    /// Runs the whole stack over a padded batch. `lengths` gives each row's tokens (padding
    /// after them; `None`: no padding); `h0` is PyTorch's `(layers x directions, B, H)`
    /// initial state (`None`: zeros).
    ///
    /// # Shapes
    /// x (B, T, I) -> (outputs (B, T, directions x H), final states (layers x directions, B, H))
    pub fn forward(
        &self,
        x: &Tensor,
        lengths: Option<&[usize]>,
        h0: Option<&Tensor>,
        mode: Mode,
    ) -> Result<(Tensor, Tensor)> {
        let (b, t, _) = x.dims3()?;
        let masks = match lengths {
            Some(lens) => {
                if lens.len() != b {
                    candle_core::bail!("GRU: {} lengths for a batch of {b} rows", lens.len());
                }
                let mut m = Vec::with_capacity(t);
                for step in 0..t {
                    let col: Vec<f32> = lens.iter().map(|&l| (step < l) as u8 as f32).collect();
                    m.push(Tensor::from_vec(col, (b, 1), x.device())?.to_dtype(x.dtype())?);
                }
                Some(m)
            }
            None => None,
        };
        let dirs = self.directions();
        let zeros = Tensor::zeros((b, self.hidden), x.dtype(), x.device())?;
        let init = |k: usize| -> Result<Tensor> {
            match h0 {
                Some(h) => h.get(k),
                None => Ok(zeros.clone()),
            }
        };
        let mut input = x.clone();
        let mut finals = Vec::with_capacity(self.layers.len() * dirs);
        for (l, (fwd, rev)) in self.layers.iter().enumerate() {
            if l > 0 {
                input = self.dropout.forward(&input, mode)?;
            }
            let (out_f, h_f) = fwd.run(&input, &init(l * dirs)?, masks.as_deref(), false)?;
            finals.push(h_f);
            input = match rev {
                Some(rev) => {
                    let (out_r, h_r) =
                        rev.run(&input, &init(l * dirs + 1)?, masks.as_deref(), true)?;
                    finals.push(h_r);
                    Tensor::cat(&[out_f, out_r], D::Minus1)?
                }
                None => out_f,
            };
        }
        Ok((input, Tensor::stack(&finals, 0)?))
    }
}
