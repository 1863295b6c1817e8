//! The ids every model needs beyond its text's tokens: this project's tokenizers' fixed
//! ones, or a published model's own ([`crate::published`]).

/// The ids every model needs beyond the text's own tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Specials {
    /// Padding: never attended to, never counted in a loss.
    pub pad: u32,
    /// Beginning of sentence: the first decoder input.
    pub bos: u32,
    /// End of sentence: the last decoder target; decoding stops at it.
    pub eos: u32,
    /// Unknown: what a character outside the vocabulary becomes.
    pub unk: u32,
    /// What ends every source sentence: `<eos>` for this project's models; published models
    /// say whether they take one (CTranslate2's `add_source_eos`, Marian's `</s>`).
    pub source_end: Option<u32>,
}

impl Specials {
    /// The fixed ids of this crate's tokenizers (0, 1, 2, 3).
    pub const FIXED: Specials = Specials {
        pad: 0,
        bos: 1,
        eos: 2,
        unk: 3,
        source_end: Some(2),
    };
}
