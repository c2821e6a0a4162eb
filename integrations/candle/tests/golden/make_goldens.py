#!/usr/bin/env python3
"""Generate goldens.json for dynemb-candle from real TensorFlow Recommenders-Addons.

Runs TFRA's `de.embedding_lookup`, `de.embedding_lookup_sparse` and
`de.safe_embedding_lookup_sparse` on one `de.Variable` (int64 -> float32, dim 4,
initializer 0.5) and records inputs/outputs as plain JSON.

Primary execution: eager, default model mode (TRAIN), CPU.  Every case is also
cross-checked bit-for-bit against
  * a `tf.function` run (ShadowVariable path, grappler enabled),
  * a TF1 graph/Session run in TRAIN and INFERENCE mode (TrainableWrapper path),
  * the pure-numpy reference model below (`ref_*`), which is the executable
    form of the written spec in README.md.
Any disagreement aborts (or is recorded explicitly, see `cross_checks`).

All floats in the JSON are float32 values written as the shortest decimal that
rounds back to the same float32 (asserted, both directly decimal->f32 and via
decimal->f64->f32).  Non-finite values are written as the strings "NaN",
"Infinity", "-Infinity".

Usage:  /tmp/tfravenv/bin/python make_goldens.py [--out goldens.json] [--selftest N]
"""

import argparse
import os
import sys
from fractions import Fraction

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders_addons as tfra  # noqa: E402
from tensorflow_recommenders_addons import dynamic_embedding as de  # noqa: E402

tf.get_logger().setLevel("ERROR")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

F32 = np.float32
DIM = 4
INIT = 0.5  # constant initializer: missing ids read as [0.5, 0.5, 0.5, 0.5]

# --------------------------------------------------------------------------
# float32 <-> JSON text
# --------------------------------------------------------------------------


def _f32_exact_check(s, v):
  """Assert decimal string `s` denotes float32 `v` (round-to-nearest-even)."""
  v = F32(v)
  # Path 1: decimal -> f64 -> f32 (what serde_json `f64 as f32` does).
  assert F32(float(s)).view(np.uint32) == v.view(np.uint32), (s, v)
  # Path 2: exact decimal -> nearest f32 (what `str::parse::<f32>` does).
  d = Fraction(s)
  x = Fraction(float(v))
  lo = np.nextafter(v, F32(-np.inf), dtype=F32)
  hi = np.nextafter(v, F32(np.inf), dtype=F32)
  mid_lo = (x + Fraction(float(lo))) / 2 if np.isfinite(lo) else None
  mid_hi = (x + Fraction(float(hi))) / 2 if np.isfinite(hi) else None
  even = (int(v.view(np.uint32)) & 1) == 0
  if mid_lo is not None:
    assert d > mid_lo or (d == mid_lo and even), (s, v)
  if mid_hi is not None:
    assert d < mid_hi or (d == mid_hi and even), (s, v)


def fmt_f32(v):
  v = F32(v)
  if np.isnan(v):
    return '"NaN"'
  if np.isinf(v):
    return '"Infinity"' if v > 0 else '"-Infinity"'
  s = str(v)  # numpy: shortest repr that uniquely identifies the float32
  if s.endswith("e+00") or s.endswith("e-00"):
    s = s[:-4]
  assert s.lower() not in ("inf", "-inf", "nan")
  _f32_exact_check(s, v)
  return s


def to_json(obj, indent=0):
  pad = "  " * indent
  if obj is None:
    return "null"
  if isinstance(obj, (bool, np.bool_)):
    return "true" if obj else "false"
  if isinstance(obj, (int, np.integer)):
    return str(int(obj))
  if isinstance(obj, (float, np.floating)):
    return fmt_f32(obj)
  if isinstance(obj, str):
    import json
    return json.dumps(obj)
  if isinstance(obj, np.ndarray):
    return to_json(obj.tolist() if obj.dtype != F32 else _f32_nested(obj),
                   indent)
  if isinstance(obj, (list, tuple)):
    if all(not isinstance(x, (list, tuple, dict, np.ndarray)) for x in obj):
      return "[" + ", ".join(to_json(x) for x in obj) + "]"
    inner = ",\n".join(pad + "  " + to_json(x, indent + 1) for x in obj)
    return "[\n" + inner + "\n" + pad + "]"
  if isinstance(obj, dict):
    inner = ",\n".join(pad + "  " + to_json(str(k)) + ": " +
                       to_json(v, indent + 1) for k, v in obj.items())
    return "{\n" + inner + "\n" + pad + "}"
  raise TypeError(type(obj))


def _f32_nested(a):
  if a.ndim == 0:
    return F32(a)
  return [_f32_nested(x) for x in a]


def bits(a):
  return np.ascontiguousarray(np.asarray(a, dtype=F32)).view(np.uint32)


def same_bits(a, b):
  a = np.asarray(a, F32)
  b = np.asarray(b, F32)
  return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def same_bits_nan(a, b):
  """Bit-exact, except that any NaN equals any NaN (sign/payload ignored)."""
  a = np.asarray(a, F32)
  b = np.asarray(b, F32)
  if a.shape != b.shape:
    return False
  na, nb = np.isnan(a), np.isnan(b)
  return np.array_equal(na, nb) and np.array_equal(bits(a)[~na], bits(b)[~nb])


def max_ulp(a, b):
  a = np.asarray(a, F32).ravel().view(np.int32).astype(np.int64)
  b = np.asarray(b, F32).ravel().view(np.int32).astype(np.int64)
  if a.size == 0:
    return 0
  a = np.where(a < 0, -(a & 0x7FFFFFFF), a)
  b = np.where(b < 0, -(b & 0x7FFFFFFF), b)
  return int(np.abs(a - b).max())


# --------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1

BASE_ROWS = [
    (-5, [1.0, 2.0, 3.0, 4.0]),  # norm sqrt(30) ~ 5.48 -> clipped by 2.0
    (-1, [30.0, -40.0, 0.0, 0.0]),  # norm 50
    (0, [0.1, 0.2, 0.3, 0.4]),  # norm ~0.548 (non-dyadic values)
    (1, [-1.0, 0.0, 0.0, 0.0]),  # norm 1
    (2, [3.0, 4.0, 0.0, 0.0]),  # norm 5
    (3, [1.0 / 3, 2.0 / 3, -1.0 / 3, 0.5]),  # norm ~0.898
    (7, [100.0, 0.0, 0.0, -100.0]),  # norm ~141
    (9, [0.0, 0.0, 0.0, 0.0]),  # zero row (clip of a zero vector)
    (1 << 40, [-2.0, 1.0, -0.5, 0.25]),  # norm ~2.305, just above 2.0
    (11, [0.0, 2.0, 0.0, 0.0]),  # norm exactly 2.0
    (12, [0.7, -0.1, 1.3, 0.9]),  # norm ~1.73 (non-dyadic, < 2, > 0.7)
    (13, [1e-25, -2e-25, 3e-25, 0.0]),  # squares underflow to 0 in f32
    (14, [3e19, -4e19, 0.0, 0.0]),  # squares overflow to inf in f32
    (15, [-0.0, 0.0, -0.0, 1.5]),  # signed zeros
    (I64_MIN, [-8.0, 0.125, 6.0, -0.75]),
    (I64_MAX, [2.5, -2.5, 2.5, -2.5]),
]
STRESS_IDS = list(range(200, 232))
MISSING = [4, 5, 8, 100, -7, -(1 << 40), 1 << 41]  # never inserted


def build_table():
  rng = np.random.default_rng(20240601)
  ids = [i for i, _ in BASE_ROWS]
  vals = [row for _, row in BASE_ROWS]
  for k in STRESS_IDS:
    scale = [0.1, 1.0, 3.0, 25.0][k % 4]
    vals.append((rng.standard_normal(DIM) * scale).tolist())
    ids.append(k)
  vals = np.asarray(vals, dtype=F32)
  assert len(set(ids)) == len(ids)
  assert not set(ids) & set(MISSING)
  return np.asarray(ids, np.int64), vals


# --------------------------------------------------------------------------
# Reference model (the spec, executable).  Pure numpy float32.
# --------------------------------------------------------------------------


class Ref:

  def __init__(self, ids, vals, square=None, rsqrt=None):
    self.table = {int(k): vals[i] for i, k in enumerate(ids)}
    # w**2 as computed by math_ops.pow(weights, 2) in sqrtn-weighted combiner.
    # Eager: Eigen pow kernel (== w*w for the dyadic golden weights; can be
    # 1 ulp off w*w for arbitrary floats).  Graph/tf.function: grappler
    # rewrites Pow(x, 2) -> Square(x) == w*w exactly.
    self.square = square or (lambda w: w * w)
    # Graph/tf.function only: grappler rewrites Div(x, Sqrt(y)) into
    # Mul(x, Rsqrt(y)); pass TF's Rsqrt kernel here to model that.
    self.rsqrt = rsqrt

  def lookup(self, ids):
    ids = np.asarray(ids, np.int64).ravel()
    out = np.full((ids.size, DIM), F32(INIT), dtype=F32)
    for i, k in enumerate(ids):
      if int(k) in self.table:
        out[i] = self.table[int(k)]
    return out

  @staticmethod
  def clip_once(x, c):
    """tf.clip_by_norm(x, c, axes=[-1]) for float32, TF 2.16 semantics."""
    c = F32(c)
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
      sq = x * x
    l2 = sq[..., 0]
    for j in range(1, x.shape[-1]):  # Eigen: sequential for dim 4 (verified)
      l2 = l2 + sq[..., j]
    pos = l2 > 0
    with np.errstate(invalid="ignore"):
      l2norm = np.where(pos, np.sqrt(np.where(pos, l2, F32(1))), l2)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
      return (x * c) / np.maximum(l2norm, c)[..., None]

  @classmethod
  def clip(cls, x, c):
    # TRAIN mode: ShadowVariable/TrainableWrapper clip in prefetch_values()
    # AND again in _read_variable_op() -> clip_by_norm applied twice.
    if c is None:
      return x
    return cls.clip_once(cls.clip_once(x, c), c)

  def embedding_lookup(self, ids, shape, max_norm):
    out = self.clip(self.lookup(ids), max_norm)
    return out.reshape(list(shape) + [DIM])

  @staticmethod
  def _unique(ids):
    uniq, idx, seen = [], [], {}
    for k in ids:
      k = int(k)
      if k not in seen:
        seen[k] = len(uniq)
        uniq.append(k)
      idx.append(seen[k])
    return np.asarray(uniq, np.int64), np.asarray(idx, np.int64)

  @staticmethod
  def _segments(seg):
    """[(segment_id, start, end)] for nondecreasing segment ids."""
    out = []
    n = len(seg)
    s = 0
    while s < n:
      e = s + 1
      while e < n and seg[e] == seg[s]:
        e += 1
      if e < n:
        assert seg[e] > seg[s], "segment ids are not increasing"
      out.append((int(seg[s]), s, e))
      s = e
    return out

  @staticmethod
  def _segment_sum_dense(x, segs, nrows):
    """math_ops.segment_sum: copy for 1 element, else 0 + x0 + x1 + ..."""
    out = np.zeros((nrows,) + x.shape[1:], F32)
    for r, s, e in segs:
      if e - s == 1:
        out[r] = x[s]
      else:
        acc = np.zeros(x.shape[1:], F32)
        for j in range(s, e):
          acc = acc + x[j]
        out[r] = acc
    return out

  @staticmethod
  def _sparse_segment(emb, idx, segs, nrows, combiner):
    """tf.sparse.segment_{sum,mean,sqrt_n} CPU kernel (ReduceImpl)."""
    out = np.zeros((nrows, DIM), F32)  # empty segments -> 0
    for r, s, e in segs:
      num = e - s
      rows = [emb[idx[j]] for j in range(s, e)]
      if num == 1:
        out[r] = rows[0]
        continue
      if combiner == "mean" and num < 10:
        scale = F32(1) / F32(num)
      elif combiner == "sqrtn" and num < 10:
        scale = F32(1) / F32(np.sqrt(np.float64(num)))
      else:
        scale = F32(1)
      k = num & 7
      if k == 0:
        k = 8
      elif k == 1:
        k = 9
      acc = rows[0]
      for j in range(1, k):
        acc = acc + rows[j]
      acc = acc * scale
      while k < num:
        blk = rows[k]
        for j in range(1, 8):
          blk = blk + rows[k + j]
        acc = acc + blk
        k += 8
      if combiner == "mean" and num >= 10:
        acc = acc / F32(num)
      if combiner == "sqrtn" and num >= 10:
        acc = acc / F32(np.sqrt(np.float64(num)))
      out[r] = acc
    return out

  def embedding_lookup_sparse(self, indices, ids, weights, combiner, max_norm,
                              rank=2):
    indices = np.asarray(indices, np.int64).reshape(len(ids), rank)
    seg = indices[:, 0] if len(ids) else np.zeros((0,), np.int64)
    segs = self._segments(seg)
    nrows = int(seg[-1]) + 1 if len(ids) else 0
    uniq, idx = self._unique(ids)
    emb = self.clip(self.lookup(uniq), max_norm)
    if weights is None:
      return self._sparse_segment(emb, idx, segs, nrows, combiner)
    w = np.asarray(weights, F32)
    x = emb[idx] * w[:, None]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
      s = self._segment_sum_dense(x, segs, nrows)
      if combiner == "sum":
        return s
      if combiner == "mean":
        ws = self._segment_sum_dense(w[:, None], segs, nrows)
        return s / ws
      w2 = self._segment_sum_dense(self.square(w)[:, None], segs, nrows)
      if self.rsqrt is not None:
        return s * self.rsqrt(w2)
      return s / np.sqrt(w2)

  def safe_embedding_lookup_sparse(self, indices, ids, dense_shape, weights,
                                   combiner, default_id, max_norm):
    ids = np.asarray(ids, np.int64)
    shape = [int(d) for d in dense_shape]
    rank = len(shape)
    indices = np.asarray(indices, np.int64).reshape(len(ids), rank)
    nrows = int(np.prod(shape[:-1], dtype=np.int64))  # prod([]) == 1
    if len(ids):
      lin = np.ravel_multi_index(tuple(indices[:, :-1].T), shape[:-1]) \
          if rank > 1 else np.zeros(len(ids), np.int64)
    else:
      lin = np.zeros((0,), np.int64)
    w = None if weights is None else np.asarray(weights, F32)
    if w is not None and combiner != "sum":
      keep = w > 0  # NaN and <= 0 are dropped; ids are never pruned
      lin, ids, w = lin[keep], ids[keep], w[keep]
    # tf.sparse.fill_empty_rows: stable counting sort by row, empty rows get
    # one entry (row, 0) with id (default_id or 0) and weight 1.0
    fill_id = default_id or 0
    empty = np.ones(nrows, bool)
    empty[lin] = False
    order = np.argsort(lin, kind="stable")
    rows, new_ids, new_w = [], [], []
    pos = 0
    for r in range(nrows):
      if empty[r]:
        rows.append(r)
        new_ids.append(fill_id)
        new_w.append(F32(1.0))
      while pos < len(order) and lin[order[pos]] == r:
        rows.append(r)
        new_ids.append(int(ids[order[pos]]))
        if w is not None:
          new_w.append(w[order[pos]])
        pos += 1
    ind2 = np.stack([np.asarray(rows, np.int64),
                     np.zeros(len(rows), np.int64)], 1) if rows else \
        np.zeros((0, 2), np.int64)
    res = self.embedding_lookup_sparse(ind2, new_ids,
                                       None if w is None else new_w, combiner,
                                       max_norm)
    if default_id is None:
      res = np.where(empty[:, None], F32(0), res).astype(F32)
    return res.reshape(shape[:-1] + [DIM])


# --------------------------------------------------------------------------
# Running TFRA
# --------------------------------------------------------------------------

_counter = [0]


def fresh_name(tag):
  # Each call gets a fresh name: TFRA caches the per-name ShadowVariable
  # *including its max_norm* in var._trainable_store (see quirk cases).
  _counter[0] += 1
  return "g%04d_%s" % (_counter[0], tag)


def sp_tensors(case):
  rank = len(case["dense_shape"])
  ind = np.asarray(case["indices"], np.int64).reshape(len(case["ids"]), rank)
  sp_ids = tf.SparseTensor(tf.constant(ind, tf.int64),
                           tf.constant(np.asarray(case["ids"], np.int64)),
                           tf.constant(case["dense_shape"], tf.int64))
  sp_w = None
  if case["weights"] is not None:
    sp_w = tf.SparseTensor(sp_ids.indices,
                           tf.constant(np.asarray(case["weights"], F32)),
                           sp_ids.dense_shape)
  return sp_ids, sp_w


def call_tfra(var, case, name, ids_t=None, sp=None):
  fn = case["function"]
  if fn == "embedding_lookup":
    return de.embedding_lookup(var, ids_t, name=name,
                               max_norm=case["max_norm"])
  sp_ids, sp_w = sp
  if fn == "embedding_lookup_sparse":
    return de.embedding_lookup_sparse(var, sp_ids, sp_w, name=name,
                                      combiner=case["combiner"],
                                      max_norm=case["max_norm"])
  if fn == "safe_embedding_lookup_sparse":
    return de.safe_embedding_lookup_sparse(var, sp_ids, sp_w, name=name,
                                           combiner=case["combiner"],
                                           default_id=case["default_id"],
                                           max_norm=case["max_norm"])
  raise ValueError(fn)


def dense_ids(case):
  return tf.constant(
      np.asarray(case["ids"], np.int64).reshape(case["shape"]), tf.int64)


def run_eager(var, case):
  name = fresh_name("eager")
  if case["function"] == "embedding_lookup":
    return call_tfra(var, case, name, ids_t=dense_ids(case)).numpy()
  return call_tfra(var, case, name, sp=sp_tensors(case)).numpy()


def run_tf_function(var, case):
  name = fresh_name("fn")
  if case["function"] == "embedding_lookup":

    @tf.function
    def f(ids_t):
      return call_tfra(var, case, name, ids_t=ids_t)

    return f(dense_ids(case)).numpy()

  # A de.Variable cannot be passed to the sparse lookups inside tf.function
  # (Variable.embedding_lookup asks for return_trainable=True, which raises
  # NotImplementedError there).  The documented pattern is to create a
  # ShadowVariable eagerly and pass it as params; its max_norm is fixed at
  # construction (ShadowVariable.embedding_lookup ignores the max_norm arg).
  shadow = de.shadow_ops.ShadowVariable(var, name=name,
                                        max_norm=case["max_norm"])

  @tf.function
  def g(sp_ids, sp_w):
    return call_tfra(shadow, case, name, sp=(sp_ids, sp_w))

  return g(*sp_tensors(case)).numpy()


def run_graph_v1(ids, vals, cases, mode):
  """Same cases through TF1 graph + Session (TrainableWrapper path).

  Inputs are fed through placeholders: with tf.constant inputs grappler's
  constant folding would rewrite x / const(weight_sum) into
  x * reciprocal(const), which is an artifact of the test, not of TFRA.
  """
  prev = de.get_model_mode()
  if mode == "inference":
    de.enable_inference_mode()
  else:
    de.enable_train_mode()
  try:
    g = tf.Graph()
    with g.as_default():
      var = de.get_variable("golden_graph_" + mode, key_dtype=tf.int64,
                            value_dtype=tf.float32, dim=DIM,
                            initializer=INIT)
      up = var.upsert(tf.constant(ids), tf.constant(vals))
      outs, feeds = [], []
      ph = tf.compat.v1.placeholder
      for c in cases:
        name = fresh_name("graph_" + mode)
        feed = {}
        if c["function"] == "embedding_lookup":
          ids_t = ph(tf.int64, shape=c["shape"])
          feed[ids_t] = np.asarray(c["ids"], np.int64).reshape(c["shape"])
          outs.append(call_tfra(var, c, name, ids_t=ids_t))
        else:
          rank = len(c["dense_shape"])
          ind = ph(tf.int64, shape=[None, rank])
          idv = ph(tf.int64, shape=[None])
          shp = ph(tf.int64, shape=[rank])
          feed[ind] = np.asarray(c["indices"], np.int64).reshape(-1, rank)
          feed[idv] = np.asarray(c["ids"], np.int64)
          feed[shp] = np.asarray(c["dense_shape"], np.int64)
          sp_ids = tf.SparseTensor(ind, idv, shp)
          sp_w = None
          if c["weights"] is not None:
            wv = ph(tf.float32, shape=[None])
            feed[wv] = np.asarray(c["weights"], F32)
            sp_w = tf.SparseTensor(ind, wv, shp)
          outs.append(call_tfra(var, c, name, sp=(sp_ids, sp_w)))
        feeds.append(feed)
      size = var.size()
      init = [tf.compat.v1.global_variables_initializer(),
              tf.compat.v1.local_variables_initializer()]
      with tf.compat.v1.Session(graph=g) as sess:
        sess.run(init)
        sess.run(up)
        res = [sess.run(o, feed_dict=f) for o, f in zip(outs, feeds)]
        return res, int(sess.run(size))
  finally:
    de.ModelMode.CURRENT_SETTING = prev


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------


def el(name, ids, shape, max_norm=None, note=None):
  c = {"name": name, "function": "embedding_lookup",
       "ids": [int(x) for x in np.asarray(ids, np.int64).ravel()],
       "shape": list(shape), "indices": None, "dense_shape": None,
       "weights": None, "combiner": None, "max_norm": max_norm,
       "default_id": None}
  if note:
    c["note"] = note
  return c


def sparse_case(fn, name, entries, dense_shape, weights, combiner,
                max_norm=None, default_id=None, note=None):
  """entries: list of (index tuple, id)."""
  assert fn == "safe_embedding_lookup_sparse" or default_id is None
  c = {"name": name, "function": fn,
       "ids": [int(e[1]) for e in entries], "shape": None,
       "indices": [list(map(int, e[0])) for e in entries],
       "dense_shape": list(dense_shape),
       "weights": None if weights is None else [float(F32(w)) for w in weights],
       "combiner": combiner, "max_norm": max_norm, "default_id": default_id}
  if note:
    c["note"] = note
  return c


BIG = 1 << 40

# rows: 0 empty (leading), 1 repeats, 2 neg/missing/big + weight 0 & negative,
# 3 empty (middle), 4 weights summing to 0, 5 single, 6-7 empty (trailing)
ELS_MAIN = [((1, 0), 1), ((1, 1), 2), ((1, 2), 1),
            ((2, 0), -5), ((2, 1), 4), ((2, 3), BIG),
            ((4, 0), 2), ((4, 1), -1),
            ((5, 2), 12)]
ELS_MAIN_W = [1.0, 0.5, 2.0,
              0.0, -1.5, 3.0,
              1.0, -1.0,
              0.75]
ELS_MAIN_SHAPE = [8, 4]

# safe: 0 empty, 1 repeats, 2 weights 0/-1.5/3 (two pruned for mean/sqrtn),
# 3 all weights <= 0 (empty after pruning unless sum), 4 empty,
# 5 negative + missing id, 6 empty (trailing)
SELS_MAIN = [((1, 0), 1), ((1, 1), 2), ((1, 2), 1),
             ((2, 0), -5), ((2, 1), 4), ((2, 3), BIG),
             ((3, 0), -1), ((3, 2), 3),
             ((5, 0), 2), ((5, 1), -7), ((5, 3), I64_MIN)]
SELS_MAIN_W = [1.0, 0.5, 2.0,
               0.0, -1.5, 3.0,
               -1.0, -2.0,
               1.0, 0.25, 1.5]
SELS_MAIN_SHAPE = [7, 4]

SELS_R3 = [((0, 0, 0), 1), ((0, 0, 1), -1), ((0, 2, 0), 7),
           ((1, 1, 0), 4), ((1, 1, 2), 2), ((1, 1, 3), 2),
           ((1, 2, 1), 3)]
SELS_R3_W = [2.0, 0.5, -1.0, 1.5, 1.0, 0.25, 0.0]
SELS_R3_SHAPE = [2, 3, 4]


def stress_entries(seed, nrows, max_len, ncols=24, rank3=False):
  rng = np.random.default_rng(seed)
  entries, weights = [], []
  pool = STRESS_IDS + [4, 8, -7]
  lens = list(range(0, max_len + 1))
  for r in range(nrows):
    n = lens[r % len(lens)] if r < len(lens) else int(rng.integers(0, max_len))
    cols = np.sort(rng.choice(ncols, size=n, replace=False))
    for c in cols:
      entries.append(((r, int(c)), int(rng.choice(pool))))
      weights.append(float(int(rng.integers(-8, 33)) / 16.0))  # dyadic
  return entries, weights


def mn_tag(mn):
  if mn is None:
    return "nonorm"
  return "maxnorm" + ("%g" % mn).replace(".", "p")


def build_cases():
  cases = []
  # ---- embedding_lookup --------------------------------------------------
  r1 = [0, -5, 4, 1, 1, BIG, -7, 9, 2, 1 << 41, I64_MIN, I64_MAX]
  r2 = [[3, -1, 5], [3, 8, -5]]
  r3 = [[[2, 2], [4, -1]], [[7, 12], [13, 14]]]
  for mn in (None, 2.0):
    tag = mn_tag(mn)
    cases.append(el("el_rank1_" + tag, r1, [len(r1)], mn))
    cases.append(el("el_rank2_" + tag, r2, [2, 3], mn))
  cases.append(el("el_rank3_maxnorm2", r3, [2, 2, 2], 2.0))
  cases.append(el("el_rank0_maxnorm2", [-5], [], 2.0,
                  note="scalar id -> output shape [dim]"))
  cases.append(el("el_empty_maxnorm2", [], [0], 2.0))
  cases.append(el("el_empty_rank2", [], [2, 0], None))
  extremes = [11, 12, 13, 14, 15, 9, 0, 3, 1, BIG, 2, 4]
  for mn in (None, 2.0, 0.7, 3.3):
    cases.append(el("el_extremes_" + mn_tag(mn), extremes, [len(extremes)], mn,
                    note="ids 13 (squares underflow), 14 (squares overflow "
                    "-> clip gives 0 vector), 11 (norm exactly 2), "
                    "15 (signed zeros), 4 missing"))
  cases.append(el("el_stress_maxnorm2", STRESS_IDS, [4, 8], 2.0))
  cases.append(el("el_stress_maxnorm0p7", STRESS_IDS, [32], 0.7))
  # ---- embedding_lookup_sparse ------------------------------------------
  F = "embedding_lookup_sparse"
  for comb in ("sum", "mean", "sqrtn"):
    for wtag in ("now", "w"):
      for mn in (None, 2.0):
        tag = mn_tag(mn)
        cases.append(sparse_case(
            F, "els_main_%s_%s_%s" % (comb, wtag, tag), ELS_MAIN,
            ELS_MAIN_SHAPE, None if wtag == "now" else ELS_MAIN_W, comb, mn))
  for comb in ("sum", "mean", "sqrtn"):
    cases.append(sparse_case(F, "els_empty_%s_w" % comb, [], [3, 5], [],
                             comb, 2.0))
    cases.append(sparse_case(F, "els_empty_%s_now" % comb, [], [3, 5], None,
                             comb, None))
  cases.append(sparse_case(
      F, "els_rank3_sum_w", SELS_R3, SELS_R3_SHAPE, SELS_R3_W, "sum", 2.0,
      note="rank-3 input: segments are indices[:,0] only -> [d0', dim]"))
  cases.append(sparse_case(
      F, "els_rank3_mean_now", SELS_R3, SELS_R3_SHAPE, None, "mean", None))
  cases.append(sparse_case(
      F, "els_rank1_sum_now", [((1,), 2), ((3,), 4)], [5], None, "sum", None,
      note="rank-1 input: each position is its own segment"))
  cases.append(sparse_case(
      F, "els_unsorted_cols_sum_now", [((0, 2), 2), ((0, 0), 1), ((0, 1), 3),
                                       ((1, 1), 12), ((1, 0), 0)], [2, 3],
      None, "sum", None, note="column order inside a row is irrelevant; "
      "summation follows entry order"))
  for comb in ("sum", "mean", "sqrtn"):
    for wtag in ("now", "w"):
      for mn in (None, 2.0):
        tag = mn_tag(mn)
        ent, w = stress_entries(7, 26, 21)
        cases.append(sparse_case(
            F, "els_stress_%s_%s_%s" % (comb, wtag, tag), ent, [27, 24],
            None if wtag == "now" else w, comb, mn,
            note="row r has r ids for r<=21 (exercises the num>=10 path)"))
  # ---- safe_embedding_lookup_sparse -------------------------------------
  F = "safe_embedding_lookup_sparse"
  for comb in ("sum", "mean", "sqrtn"):
    for wtag in ("now", "w"):
      for did in (None, 3):
        for mn in (None, 2.0):
          tag = mn_tag(mn)
          dtag = "nodef" if did is None else "def%d" % did
          cases.append(sparse_case(
              F, "sels_main_%s_%s_%s_%s" % (comb, wtag, dtag, tag), SELS_MAIN,
              SELS_MAIN_SHAPE, None if wtag == "now" else SELS_MAIN_W, comb,
              mn, did))
  for did, mn in ((0, None), (0, 2.0), (8, 0.7), (-1, 2.0), (BIG, None),
                  (14, 2.0)):
    for comb in ("sum", "mean"):
      cases.append(sparse_case(
          F, "sels_main_%s_w_def%s_%s" %
          (comb, str(did).replace("-", "m"), mn_tag(mn)),
          SELS_MAIN, SELS_MAIN_SHAPE, SELS_MAIN_W, comb, mn, did,
          note="default_id 0 is honoured (is not None); 8 is a missing id"))
  for comb in ("sum", "mean", "sqrtn"):
    for did in (None, 7):
      cases.append(sparse_case(F, "sels_empty_%s_w_def%s" % (comb, did), [],
                               [3, 5], [], comb, 2.0, did))
  cases.append(sparse_case(F, "sels_empty_zero_rows", [], [0, 5], None, "mean",
                           None, 3))
  cases.append(sparse_case(F, "sels_rank3_zero_dim", [], [2, 0, 4], None,
                           "mean", None, 3))
  for comb in ("sum", "mean", "sqrtn"):
    for wtag in ("now", "w"):
      for did in (None, 3):
        cases.append(sparse_case(
            F, "sels_rank3_%s_%s_def%s" % (comb, wtag, did), SELS_R3,
            SELS_R3_SHAPE, None if wtag == "now" else SELS_R3_W, comb, 2.0,
            did, note="dense_shape [a,b,c] -> output [a,b,dim]"))
  for did in (None, 2):
    cases.append(sparse_case(
        F, "sels_rank1_mean_def%s" % did, [((1,), 2), ((3,), 4)], [5], None,
        "mean", 2.0, did, note="rank-1 input -> whole tensor is one row -> "
        "output shape [dim]"))
    cases.append(sparse_case(
        F, "sels_rank1_empty_def%s" % did, [], [5], None, "sum", 2.0, did))
  cases.append(sparse_case(
      F, "sels_unsorted_rows_sum_w", [((2, 0), 2), ((0, 1), 1), ((0, 0), 3),
                                      ((2, 1), 12)], [4, 2],
      [1.0, 2.0, 0.5, -1.0], "sum", 2.0, None,
      note="row order not canonical: fill_empty_rows sorts rows stably"))
  for comb in ("sum", "mean", "sqrtn"):
    for wtag in ("now", "w"):
      for did in (None, 5):
        ent, w = stress_entries(11, 26, 21)
        cases.append(sparse_case(
            F, "sels_stress_%s_%s_def%s" % (comb, wtag, did), ent, [28, 24],
            None if wtag == "now" else w, comb, 2.0, did))
  names = [c["name"] for c in cases]
  assert len(names) == len(set(names)), "duplicate case names"
  return cases


def ref_run(ref, case):
  fn = case["function"]
  if fn == "embedding_lookup":
    return ref.embedding_lookup(case["ids"], case["shape"], case["max_norm"])
  if fn == "embedding_lookup_sparse":
    return ref.embedding_lookup_sparse(case["indices"], case["ids"],
                                       case["weights"], case["combiner"],
                                       case["max_norm"],
                                       len(case["dense_shape"]))
  return ref.safe_embedding_lookup_sparse(case["indices"], case["ids"],
                                          case["dense_shape"], case["weights"],
                                          case["combiner"], case["default_id"],
                                          case["max_norm"])


# --------------------------------------------------------------------------
# Quirks (recorded separately; not part of the canonical semantics)
# --------------------------------------------------------------------------


def quirk_cases(var, ids, vals):
  out = []
  # 1. Eager INFERENCE mode: shadow_ops.embedding_lookup returns
  #    params.lookup(ids) directly -> max_norm silently ignored.
  prev = de.get_model_mode()
  de.enable_inference_mode()
  try:
    c = el("quirk_eager_inference_mode_ignores_max_norm", [-1, 2, 4, 0],
           [4], 2.0, note="de.enable_inference_mode(); eager; output is NOT "
           "clipped although max_norm=2.0")
    c["model_mode"] = "inference"
    c["output"] = run_eager(var, c)
    c["output_shape"] = list(c["output"].shape)
    out.append(c)
    c2 = sparse_case("safe_embedding_lookup_sparse",
                     "quirk_eager_inference_mode_safe_ignores_max_norm",
                     SELS_MAIN, SELS_MAIN_SHAPE, SELS_MAIN_W, "mean", 2.0, 3)
    c2["model_mode"] = "inference"
    c2["output"] = run_eager(var, c2)
    c2["output_shape"] = list(c2["output"].shape)
    out.append(c2)
    c3 = el("quirk_tf_function_inference_mode_ignores_max_norm", [-1, 2, 4, 0],
            [4], 2.0, note="de.enable_inference_mode(); inside tf.function "
            "(ShadowVariable path): NOT clipped. TF1 graph/Session "
            "(TrainableWrapper path) in inference mode DOES clip.")
    c3["model_mode"] = "inference"
    c3["output"] = run_tf_function(var, c3)
    c3["output_shape"] = list(c3["output"].shape)
    out.append(c3)
  finally:
    de.ModelMode.CURRENT_SETTING = prev
  # 2. Same `name` reused: the ShadowVariable cached under that name keeps
  #    the max_norm of the FIRST call.
  name = fresh_name("reused")
  first = de.embedding_lookup(var, tf.constant([2, -1], tf.int64), name=name,
                              max_norm=None).numpy()
  second = de.embedding_lookup(var, tf.constant([2, -1], tf.int64), name=name,
                               max_norm=2.0).numpy()
  c = el("quirk_reused_name_keeps_first_max_norm", [2, -1], [2], 2.0,
         note="second call with the same name as an earlier max_norm=None "
         "call: output is unclipped. Same applies to the default name of "
         "embedding_lookup_sparse / safe_embedding_lookup_sparse.")
  c["first_call_max_norm"] = None
  c["first_call_output"] = first
  c["output"] = second
  c["output_shape"] = list(second.shape)
  out.append(c)
  # 3. embedding_lookup_sparse with non-canonical row order -> error.
  c = sparse_case("embedding_lookup_sparse", "quirk_els_unsorted_rows_error",
                  [((1, 0), 1), ((0, 0), 2)], [2, 3], None, "sum", None)
  try:
    run_eager(var, c)
    c["error"] = None
  except tf.errors.InvalidArgumentError as e:
    c["error"] = "InvalidArgumentError: " + e.message.split("[Op:")[0].split(
        "}}")[-1].strip()
  c["output"] = None
  c["output_shape"] = None
  out.append(c)
  return out


# --------------------------------------------------------------------------
# Randomized self-test of the reference model (not written to JSON)
# --------------------------------------------------------------------------


def selftest(var, ids, vals, n, seed=99):
  rng = np.random.default_rng(seed)
  tf_square = lambda w: tf.pow(tf.constant(np.asarray(w, F32)), 2).numpy()
  ref_tfpow = Ref(ids, vals, square=tf_square)
  ref_mul = Ref(ids, vals)
  pool = [int(i) for i in ids] + MISSING
  stats = {"cases": 0, "mismatch_model_with_tf_pow": 0,
           "mismatch_model_with_w_times_w": 0,
           "max_ulp_model_with_w_times_w": 0}
  for t in range(n):
    fn = ["embedding_lookup", "embedding_lookup_sparse",
          "safe_embedding_lookup_sparse"][t % 3]
    mn = [None, 2.0, 0.7, 3.3, 10.0][int(rng.integers(0, 5))]
    if fn == "embedding_lookup":
      shape = [int(rng.integers(0, 6)), int(rng.integers(1, 5))]
      k = rng.choice(pool, size=int(np.prod(shape)))
      c = el("st", k, shape, mn)
    else:
      rank3 = fn.startswith("safe") and rng.random() < 0.3
      shape = [int(rng.integers(1, 9)), int(rng.integers(1, 25))]
      if rank3:
        shape = [int(rng.integers(1, 4))] + shape
      nrows = int(np.prod(shape[:-1]))
      entries = []
      for r in range(nrows):
        m = int(rng.integers(0, min(shape[-1], 20) + 1))
        if rng.random() < 0.25:
          m = 0
        for col in np.sort(rng.choice(shape[-1], size=m, replace=False)):
          idx = np.unravel_index(r, shape[:-1]) + (int(col),)
          entries.append((tuple(int(i) for i in idx), int(rng.choice(pool))))
      if fn == "embedding_lookup_sparse" and not entries:
        entries = [((0,) * len(shape), 2)]
      w = None
      if rng.random() < 0.6:
        w = (rng.standard_normal(len(entries)) *
             np.exp(rng.uniform(-2, 2, len(entries)))).astype(F32)
      comb = ["sum", "mean", "sqrtn"][int(rng.integers(0, 3))]
      did = [None, None, 0, 3, 4, -5][int(rng.integers(0, 6))]
      if fn == "embedding_lookup_sparse":
        did = None
      c = sparse_case(fn, "st", entries, shape, w, comb, mn, did)
    got = run_eager(var, c)
    stats["cases"] += 1
    a = ref_run(ref_tfpow, c)
    if not same_bits(a, got):
      stats["mismatch_model_with_tf_pow"] += 1
      print("SELFTEST MISMATCH", c, "\n got", got, "\n ref", a,
            file=sys.stderr)
    b = ref_run(ref_mul, c)
    if not same_bits(b, got):
      stats["mismatch_model_with_w_times_w"] += 1
      stats["max_ulp_model_with_w_times_w"] = max(
          stats["max_ulp_model_with_w_times_w"], max_ulp(b, got))
  return stats


# --------------------------------------------------------------------------


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "goldens.json"))
  ap.add_argument("--selftest", type=int, default=300,
                  help="random cases checked against the reference model")
  ap.add_argument("--no-graph", action="store_true",
                  help="skip the TF1 graph-mode cross-check")
  args = ap.parse_args()

  assert de.get_model_mode() == de.ModelMode.TRAIN
  ids, vals = build_table()
  var = de.get_variable("golden_table", key_dtype=tf.int64,
                        value_dtype=tf.float32, dim=DIM, initializer=INIT)
  var.upsert(tf.constant(ids), tf.constant(vals))
  assert int(var.size()) == len(ids)
  ref = Ref(ids, vals)
  cases = build_cases()

  tf_rsqrt = lambda x: tf.math.rsqrt(tf.constant(np.asarray(x, F32))).numpy()
  ref_graph = Ref(ids, vals, rsqrt=tf_rsqrt)
  problems = []
  fn_diff = {}
  for c in cases:
    before = int(var.size())
    out = run_eager(var, c)
    after = int(var.size())
    c["output"] = out
    c["output_shape"] = list(out.shape)
    c["size_before"] = before
    c["size_after"] = after
    assert out.dtype == F32
    r = ref_run(ref, c)
    if not same_bits(r, out):
      problems.append("reference model mismatch in %s (max ulp %s)\n got %r\n"
                      " ref %r" % (c["name"], max_ulp(r, out) if r.shape ==
                                   out.shape else "shape", out, r))
    fo = run_tf_function(var, c)
    if not same_bits_nan(fo, ref_run(ref_graph, c)):
      problems.append("tf.function output not explained by the rsqrt model "
                      "in %s" % c["name"])
    if not same_bits_nan(fo, out):
      u = max_ulp(fo, out)
      fn_diff[c["name"]] = u
      c["output_graph"] = fo
      if not (c.get("weights") is not None and c["combiner"] == "sqrtn"):
        problems.append("unexpected tf.function difference in %s" % c["name"])

  graph = {}
  if not args.no_graph:
    for mode in ("train", "inference"):
      res, size = run_graph_v1(ids, vals, cases, mode)
      bad = [c["name"] for c, o in zip(cases, res)
             if not same_bits_nan(o, c.get("output_graph", c["output"]))]
      graph[mode] = ("identical to tf.function (NaN payloads ignored); "
                     "table size after: %d" % size)
      if bad:
        problems.append("graph %s mode differs from tf.function: %s" %
                        (mode, bad))

  quirks = quirk_cases(var, ids, vals)
  st = selftest(var, ids, vals, args.selftest) if args.selftest else None

  # the table must be unchanged by all of the above
  k, v = var.export()
  k, v = k.numpy(), v.numpy()
  order = np.argsort(k)
  exp_order = np.argsort(ids)
  assert np.array_equal(k[order], ids[exp_order])
  assert same_bits(v[order], vals[exp_order])

  if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
  if st and st["mismatch_model_with_tf_pow"]:
    print("selftest failed: %r" % st, file=sys.stderr)
    sys.exit(1)

  doc = {
      "tfra": tfra.__version__,
      "tensorflow": tf.__version__,
      "numpy": np.__version__,
      "python": sys.version.split()[0],
      "execution": "eager, CPU, de.ModelMode TRAIN (default); every case "
                   "re-checked bit-exact under tf.function and TF1 "
                   "graph/Session (train and inference mode)",
      "float_encoding": "all floats are float32, shortest round-trip decimal; "
                        "non-finite as \"NaN\", \"Infinity\", \"-Infinity\"",
      "dim": DIM,
      "initializer": INIT,
      "key_dtype": "int64",
      "value_dtype": "float32",
      "missing_ids_used": MISSING,
      "table": {"ids": [int(i) for i in ids], "values": vals},
      "cross_checks": {
          "reference_model": "eager outputs bit-exact (incl. NaN payload) "
                             "with Ref in make_goldens.py for all cases",
          "tf_function": "bit-exact with eager (NaN payload ignored) except "
                         "weighted sqrtn, where grappler turns x/sqrt(y) into "
                         "x*rsqrt(y); those cases carry \"output_graph\". "
                         "max ulp vs eager per case: " + repr(fn_diff),
          "graph_v1": graph or "skipped",
          "selftest": st},
      "cases": cases,
      "quirk_cases": quirks,
  }
  text = to_json(doc) + "\n"
  import json
  json.loads(text)  # valid JSON
  with open(args.out, "w") as f:
    f.write(text)
  print("wrote %s: %d cases, %d quirk cases; selftest %r; graph %r" %
        (args.out, len(cases), len(quirks), st, graph))


if __name__ == "__main__":
  main()
