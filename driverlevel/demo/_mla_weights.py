"""Configuration and seeded weights of the demo MLA target model (host, numpy only).

The model is one MLA layer in absorbed form with an LM head, small enough to
build from a seed in a second and real enough to exercise every kernel of a
decode step: embedding gather, query and latent-KV projections, the verify
attention over the paged cache, output projection, residual, LM head, argmax.

Why the weights are structured
------------------------------
Speculative decoding is checked *lossless* by comparing its tokens with plain
greedy decoding. The two runs compute the same function through differently
shaped kernels (another split of the keys, other tiles, a tree instead of one
token), so their logits differ by bf16 rounding noise, and a random model has
top-1 margins with a density at zero: over thousands of tokens a few would flip
and the check would fail for reasons unrelated to correctness. The weights are
therefore random *within a structure* whose top-1 margins are bounded away from
zero:

* Every token ``t`` has a class ``cls[t]`` in ``[0, num_classes)`` and a unit
  random feature vector ``r[t]`` (``feature_dim`` values). Its embedding is
  ``[one_hot(cls[t]) | r[t]]`` (``d_model = num_classes + feature_dim``).
* Latent KV row of ``t`` (576): ``c_kv[0:num_classes] = one_hot(cls[t])``,
  ``c_kv[num_classes:512]`` = a small random projection of ``r[t]`` ("value
  noise"), ``k_pe[0:64]`` = a random projection of ``r[t]``.
* Query of head ``h`` for the current token ``c``: ``q[0:num_classes] =
  score_unit * rank_h[cls[c]]`` where ``rank_h[p]`` is a random permutation of
  ``1 .. num_classes`` (integers, exact in bf16), ``q[512:576]`` a random
  projection of ``r[c]``, the rest zero. A score is thus ``score_unit *
  rank_h[cls[c]][cls[t]]`` plus a small random rope term: classes differ by at
  least ``score_unit`` (1024 raw, ~106 in log2 units at the default scale), so
  each head's softmax selects, exactly up to rounding, the best-ranked class
  present among the visible keys; keys of that class share ``c_kv[0:num_classes]``.
  Head ``h`` outputs ``one_hot(selected class)`` plus a mix of value noise.
* Output projection: the one-hot of class ``k`` in head ``h`` adds, when the
  pair ``(h, k)`` is a *steering* pair (probability ``steer_prob``),
  ``beta_h * r[sigma[target_h[k]]]`` to the residual stream, with
  ``beta_h = steer_gain + steer_step * h``. Value noise adds a small random term.
* LM head: ``logit[v] = logit_scale * (h_feat . r[sigma[v]]) + class bias``
  with ``sigma`` a random permutation of the vocabulary, so the current token
  ``c`` alone predicts ``pi(c) = sigma^-1(c)`` with margin ``~0.7 logit_scale``,
  a steering head predicts its target with margin ``~(beta - 1) logit_scale``,
  and two steering heads differ by ``steer_step * logit_scale``.

The context therefore perturbs the next-token rule of the current token with a
controllable rate (``steer_prob``) and strength (``steer_gain``), while every
top-1 margin stays orders of magnitude above bf16 noise (see
:func:`driverlevel.demo.reference.margin_report`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .._dtypes import f32_to_bf16_bits

__all__ = ["MLAModelConfig", "MLAWeights", "make_weights", "QK_DIM", "V_DIM", "ROPE_DIM"]

QK_DIM = 576
V_DIM = 512
ROPE_DIM = QK_DIM - V_DIM
DEFAULT_SM_SCALE = 1.0 / math.sqrt(192.0)


@dataclass(frozen=True)
class MLAModelConfig:
    """Shape and seed of the demo MLA model.

    Attributes
    ----------
    vocab_size : int
        Vocabulary size (a multiple of 8, >= 64). Default 32768.
    num_heads : int
        Query heads (all share the one latent KV head). Default 9 (the seed deployment's
        heads per rank).
    num_classes : int
        Token classes the attention selects among (8 .. 256; integer score codes up to
        256 are exact in bf16). Default 256.
    feature_dim : int
        Random feature dimensions per token (a multiple of 32). Default 256.
        ``d_model = num_classes + feature_dim`` must be a multiple of 32.
    sm_scale : float
        Softmax scale of the attention (default ``1/sqrt(192)``).
    steer_prob : float
        Probability that a (head, class) pair steers the next token (context strength:
        0 gives a context-free model). Default 0.03 (about a quarter of the tokens are steered).
    steer_gain : float
        ``beta`` of head 0; must be > 1 for a steering head to win over the current token.
    steer_step : float
        ``beta_h - beta_{h-1}`` (separates two steering heads).
    logit_scale : float
        Scale of the LM head (logit units per unit of feature overlap). Default 8.
    score_unit : float
        Raw score between adjacent class ranks (a power of two). Default 1024.
    rope_std : float
        Standard deviation of the random rope part of a raw score. Default 0.5.
    value_noise : float
        Norm of the random part of a value row, relative to its one-hot part. Default 0.25.
    noise_to_logits : float
        Gain of the value noise into the residual stream. Default 0.25.
    class_bias : float
        Standard deviation of the class-dependent logit bias, in units of ``logit_scale``.
        Default 0.02.
    seed : int
        Seed of every random choice.
    """

    vocab_size: int = 32768
    num_heads: int = 9
    num_classes: int = 256
    feature_dim: int = 256
    sm_scale: float = DEFAULT_SM_SCALE
    steer_prob: float = 0.03
    steer_gain: float = 1.5
    steer_step: float = 0.5
    logit_scale: float = 8.0
    score_unit: float = 1024.0
    rope_std: float = 0.5
    value_noise: float = 0.25
    noise_to_logits: float = 0.25
    class_bias: float = 0.02
    seed: int = 0

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        for name in ("vocab_size", "num_heads", "num_classes", "feature_dim", "seed"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"MLAModelConfig.{name} must be an int, got {type(v).__name__}")
        need(self.vocab_size >= 64 and self.vocab_size % 8 == 0,
             f"vocab_size must be a multiple of 8 and >= 64, got {self.vocab_size}")
        need(self.vocab_size < 2**31, f"vocab_size must fit int32, got {self.vocab_size}")
        need(1 <= self.num_heads <= 128, f"num_heads must be in [1, 128], got {self.num_heads}")
        need(8 <= self.num_classes <= 256, f"num_classes must be in [8, 256], got {self.num_classes}")
        need(self.feature_dim >= 32 and self.feature_dim % 32 == 0,
             f"feature_dim must be a positive multiple of 32, got {self.feature_dim}")
        need(self.d_model % 32 == 0, f"d_model = num_classes + feature_dim must be a multiple of 32, got {self.d_model}")
        need(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        need(self.sm_scale > 0 and math.isfinite(self.sm_scale), f"sm_scale must be positive, got {self.sm_scale}")
        need(0.0 <= self.steer_prob <= 1.0, f"steer_prob must be in [0, 1], got {self.steer_prob}")
        need(self.steer_gain > 1.0, f"steer_gain must be > 1 (a steering head must beat the current token), got {self.steer_gain}")
        need(self.steer_step > 0.0, f"steer_step must be > 0, got {self.steer_step}")
        need(self.logit_scale > 0.0, f"logit_scale must be > 0, got {self.logit_scale}")
        m, _ = math.frexp(self.score_unit)
        need(self.score_unit >= 1 and m == 0.5, f"score_unit must be a power of two >= 1, got {self.score_unit}")
        need(self.score_unit * self.sm_scale * math.log2(math.e) >= 40.0,
             f"score_unit * sm_scale * log2(e) must be >= 40 so that the class selection saturates, got "
             f"{self.score_unit * self.sm_scale * math.log2(math.e):.1f}")
        for name in ("rope_std", "value_noise", "noise_to_logits", "class_bias"):
            need(getattr(self, name) >= 0.0, f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def d_model(self) -> int:
        """Width of the residual stream: ``num_classes + feature_dim``."""
        return self.num_classes + self.feature_dim

    def betas(self) -> np.ndarray:
        """float64 ``[num_heads]``: steering strength of each head."""
        return self.steer_gain + self.steer_step * np.arange(self.num_heads, dtype=np.float64)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MLAWeights:
    """Host copies of the model's weights (bf16 bit patterns, uint16) and its hidden structure.

    Weights use the ``nn.Linear`` layout ``[out_features, in_features]``.

    Attributes
    ----------
    config : MLAModelConfig
    embed : uint16 ``[vocab, d_model]``
    w_q : uint16 ``[num_heads * 576, d_model]``
    w_kv : uint16 ``[576, d_model]``
    w_o : uint16 ``[d_model, num_heads * 512]``
    w_lm : uint16 ``[vocab, d_model]``
    token_class : int64 ``[vocab]``
        Class of each token.
    successor : int64 ``[vocab]``
        ``pi``: the token each token predicts with no context (``sigma^-1``).
    steer_target : int64 ``[num_heads, num_classes]``
        Token that (head, class) steers towards, or -1 for a non-steering pair.
    """

    config: MLAModelConfig
    embed: np.ndarray
    w_q: np.ndarray
    w_kv: np.ndarray
    w_o: np.ndarray
    w_lm: np.ndarray
    token_class: np.ndarray
    successor: np.ndarray
    steer_target: np.ndarray

    def as_float32(self, name: str) -> np.ndarray:
        """The weight ``name`` widened to float32 (exact)."""
        bits = getattr(self, name)
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of the bf16 weights."""
        return sum(getattr(self, n).nbytes for n in ("embed", "w_q", "w_kv", "w_o", "w_lm"))


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round finite float32 values to bf16 bit patterns (nearest, ties to even), in uint32 arithmetic."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if not np.isfinite(x).all():
        return f32_to_bf16_bits(x)
    return ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)


def _unit_rows(rng, n, dim) -> np.ndarray:
    x = rng.standard_normal((n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def make_weights(config: MLAModelConfig) -> MLAWeights:
    """Generate the model's weights from ``config.seed`` on the host (deterministic).

    Parameters
    ----------
    config : MLAModelConfig

    Returns
    -------
    MLAWeights
        bf16 bit patterns; about ``2 * vocab * d_model * 2`` bytes plus the projections.
    """
    c = config
    rng = np.random.default_rng(np.random.SeedSequence([0x4D4C41, c.seed]))
    V, H, NC, F, D = c.vocab_size, c.num_heads, c.num_classes, c.feature_dim, c.d_model
    noise_dims = V_DIM - NC

    token_class = rng.integers(0, NC, size=V).astype(np.int64)
    feats = _unit_rows(rng, V, F)                       # r[t], unit norm
    sigma = rng.permutation(V).astype(np.int64)         # lm row v reads r[sigma[v]]
    successor = np.empty(V, dtype=np.int64)             # pi = sigma^-1
    successor[sigma] = np.arange(V, dtype=np.int64)

    embed = np.zeros((V, D), dtype=np.float32)
    embed[np.arange(V), token_class] = 1.0
    embed[:, NC:] = feats

    # Query: class-rank codes (exact integers times a power of two) + rope projection.
    w_q = np.zeros((H * QK_DIM, D), dtype=np.float32)
    a_rope = math.sqrt(c.rope_std / math.sqrt(ROPE_DIM)) if c.rope_std > 0 else 0.0
    for h in range(H):
        ranks = np.stack([rng.permutation(NC) + 1 for _ in range(NC)])  # ranks[p, k] in 1..NC
        w_q[h * QK_DIM:h * QK_DIM + NC, :NC] = (c.score_unit * ranks).T   # q[k] = unit*ranks[cls(c), k]
        w_q[h * QK_DIM + V_DIM:(h + 1) * QK_DIM, NC:] = rng.standard_normal((ROPE_DIM, F)) * a_rope

    # Latent KV: one-hot class, value noise, rope key.
    w_kv = np.zeros((QK_DIM, D), dtype=np.float32)
    w_kv[np.arange(NC), np.arange(NC)] = 1.0
    if noise_dims > 0:
        w_kv[NC:V_DIM, NC:] = rng.standard_normal((noise_dims, F)) * (c.value_noise / math.sqrt(noise_dims))
    w_kv[V_DIM:, NC:] = rng.standard_normal((ROPE_DIM, F)) * a_rope

    # Output projection: steering pairs write beta_h * r[sigma[target]]; value noise adds a little.
    betas = c.betas()
    steer = rng.random((H, NC)) < c.steer_prob
    targets = rng.integers(0, V, size=(H, NC)).astype(np.int64)
    steer_target = np.where(steer, targets, -1)
    w_o = np.zeros((D, H * V_DIM), dtype=np.float32)
    for h in range(H):
        ks = np.flatnonzero(steer[h])
        if ks.size:
            w_o[NC:, h * V_DIM + ks] = (betas[h] * feats[sigma[targets[h, ks]]]).T
        if noise_dims > 0 and c.noise_to_logits > 0:
            w_o[NC:, h * V_DIM + NC:(h + 1) * V_DIM] = rng.standard_normal((F, noise_dims)) * (
                c.noise_to_logits / math.sqrt(F * H))

    # LM head: features of sigma[v], plus a small class bias.
    w_lm = np.zeros((V, D), dtype=np.float32)
    w_lm[:, NC:] = c.logit_scale * feats[sigma]
    if c.class_bias > 0:
        w_lm[:, :NC] = rng.standard_normal((V, NC)) * (c.class_bias * c.logit_scale)

    bf = _bf16
    return MLAWeights(
        config=c,
        embed=bf(embed), w_q=bf(w_q), w_kv=bf(w_kv), w_o=bf(w_o), w_lm=bf(w_lm),
        token_class=token_class, successor=successor, steer_target=steer_target,
    )
