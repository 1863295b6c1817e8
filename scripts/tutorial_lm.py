"""The model of PyTorch's tutorial "Language Modeling with nn.Transformer and torchtext",
written as the tutorial writes it, shared by the scripts that produce references and
benchmarks (make_fixtures.py, make_lm_import_fixture.py, bench_lm_torch.py).

Sequence-first: ``src`` is ``[seq_len, batch_size]``. Parameter names (``embedding``,
``transformer_encoder.layers.N.*``, ``linear``) are the tutorial's, which is what
``transformer lm import-torch`` reads. ``max_len`` of the positional encoding is a parameter
here only so fixtures can keep the ``pe`` buffer small (the tutorial uses 5000).
"""

import math

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)

        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: Tensor) -> Tensor:
        """x: ``[seq_len, batch_size, embedding_dim]``"""
        x = x + self.pe[: x.size(0)]
        return self.dropout(x)


class TransformerModel(nn.Module):
    def __init__(self, ntoken: int, d_model: int, nhead: int, d_hid: int, nlayers: int,
                 dropout: float = 0.5, max_len: int = 5000):
        super().__init__()
        self.model_type = "Transformer"
        self.pos_encoder = PositionalEncoding(d_model, dropout, max_len=max_len)
        encoder_layers = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(encoder_layers, nlayers)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.1
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.linear.bias.data.zero_()
        self.linear.weight.data.uniform_(-initrange, initrange)

    def forward(self, src: Tensor, src_mask: Tensor = None) -> Tensor:
        """src: ``[seq_len, batch_size]``; returns ``[seq_len, batch_size, ntoken]``.
        Without ``src_mask`` the causal mask is built here, as the tutorial's newest version does."""
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        if src_mask is None:
            src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
        output = self.transformer_encoder(src, src_mask)
        output = self.linear(output)
        return output
