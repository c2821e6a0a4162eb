#!/usr/bin/env python3
"""Generate goldens.json for dynemb-optim with real TensorFlow.

What is emulated (per case, per step), exactly as TFRA (recommenders-addons)
trains a dynamic embedding with a Keras optimizer:

  1. take the batch's ids (occurrences, duplicates allowed) and their unique
     ids in order of first appearance;
  2. create a fresh tf.Variable "wrapper" holding the current rows of those
     unique ids (TFRA's TrainableWrapper);
  3. give the optimizer slot variables for the wrapper holding the current
     slot rows of those ids (legacy: opt.add_slot(wrapper, name,
     initializer=tensor); AdamW: build() then assign _momentums/_velocities/
     _velocity_hats);
  4. set opt.iterations to the global step index (0-based), so the bias
     corrections see t = step + 1;
  5. compute the gradient of sum(tf.gather(wrapper, positions) * grads) w.r.t.
     the wrapper: a tf.IndexedSlices whose indices are the wrapper positions of
     every occurrence (duplicates included) and whose values are the batch
     gradients;
  6. opt.apply_gradients([(indexed_slices, wrapper)]) -- the sparse path
     (_resource_apply_sparse_duplicate_indices for the legacy optimizers,
     dedup + update_step(IndexedSlices) for the Keras-2.11+ AdamW);
  7. write the wrapper and slot values back into float32 numpy tables for
     those ids only.  Rows/slots of ids not in the batch never change.

Checks done by this script (all assert):
  * for every optimizer whose TF sparse path is itself lazy (SGD, momentum,
    Adagrad, Adamax, Adadelta, FTRL, RMSprop with momentum>0), the same
    IndexedSlices applied to ONE dense tf.Variable holding the whole table
    (one optimizer, natural iterations, naturally created slots) gives
    exactly the same values and slots as the wrapper emulation;
  * an independent float32 numpy re-implementation of every per-row formula
    (the written spec, see README.md) matches TF to <= 1e-6 absolute (bitwise
    everywhere except where TF itself uses approximate vector rsqrt/pow);
  * every float written to JSON parses back to the identical float32, both
    when parsed directly as f32 and when parsed as f64 then cast to f32.

Run with the venv described in README.md:
  TF_USE_LEGACY_KERAS=1 /tmp/tfvenv/bin/python make_goldens.py
"""

import ctypes
import ctypes.util
import json
import os
import sys
from fractions import Fraction

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "goldens.json")

f32 = np.float32
DIM = 10
IDS = [-7, 0, 1, 2, 3, 5, 8, 1099511627776, 42]
ROW = {k: i for i, k in enumerate(IDS)}
B = 1099511627776
# 10 batches of id occurrences (duplicates on purpose; 42 never appears;
# 3 and 8 are first touched at step 1, when iterations == 1).
STEP_IDS = [
    [0, 1, 0, 2, 5, -7, 1],
    [B, 3, 3, 8, 0, 3],
    [5, 5, 5, 1, 2, 8, -7, B],
    [2, 0, 1, 2, 3, 8, 0, 5, 1, -7],
    [8, 8, B, B, -7, 3],
    [0, 1, 2, 3, 5, 8, -7, 0, 1, 2, B, 3],
    [3, 1, 3, 1, 3, 1, 5],
    [-7, -7, 2, 0, 8, B, 2, 5, 0],
    [1, 5, 8, 0, 1, 5],
    [B, 2, 3, -7, 0, 1, 8, 5, 2, B, 3],
]


def initial_values():
    v = np.empty((len(IDS), DIM), dtype=np.float32)
    for i in range(len(IDS)):
        for j in range(DIM):
            v[i, j] = f32(0.1 * np.sin(i * DIM + j))
    return v


def make_grads():
    out = []
    n = 0
    for ids in STEP_IDS:
        g = np.empty((len(ids), DIM), dtype=np.float32)
        for r in range(len(ids)):
            for j in range(DIM):
                k = n * DIM + j
                x = 2.0 * np.sin(1.618 * n + 0.77 * j + 0.3)
                if k % 11 == 3:
                    x *= 1e-3  # a few small gradients
                if k % 37 == 17:
                    x = 0.0  # and a few exact zeros
                g[r, j] = f32(x)
            n += 1
        out.append(g)
    return out


INIT = initial_values()
GRADS = make_grads()

# --------------------------------------------------------------------------
# libm powf (what Rust's f32::powf calls on glibc); TF's scalar tf.pow on CPU
# gives the identical result (checked below).
_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.powf.restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def powf(a, b):
    return f32(_libm.powf(f32(a), f32(b)))


def powf_arr(a, b):
    return np.vectorize(lambda x: powf(x, b), otypes=[np.float32])(a)


# --------------------------------------------------------------------------
# Cases.  params use dynemb-optim's field names.
def C(name, optimizer, params, slots, slot_initial, tf_lazy):
    return dict(name=name, optimizer=optimizer, params=params, slots=slots,
                slot_initial=slot_initial, tf_lazy=tf_lazy)


ADAM_P = dict(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-3)
FTRL_P = dict(lr=0.1, lr_power=-0.5, initial_accumulator_value=0.2, l1=0.0,
              l2=0.0, l2_shrinkage=0.0, beta=0.0)
RMS_P = dict(lr=0.05, rho=0.8, momentum=0.0, eps=1e-3, centered=False)


def ftrl_case(name, **over):
    p = dict(FTRL_P)
    p.update(over)
    return C(name, "SparseFtrl", p, ["accumulator", "linear"],
             {"accumulator": p["initial_accumulator_value"], "linear": 0.0},
             True)


def rms_case(name, **over):
    p = dict(RMS_P)
    p.update(over)
    slots = ["rms"]
    if p["momentum"] > 0:
        slots.append("momentum")
    if p["centered"]:
        slots.append("mg")
    return C(name, "SparseRmsProp", p, slots, {s: 0.0 for s in slots},
             p["momentum"] > 0)


CASES = [
    C("sgd", "SparseSgd", dict(lr=0.1), [], {}, True),
    C("momentum", "SparseMomentum", dict(lr=0.05, momentum=0.9, nesterov=False),
      ["momentum"], {"momentum": 0.0}, True),
    C("momentum_nesterov", "SparseMomentum",
      dict(lr=0.05, momentum=0.9, nesterov=True), ["momentum"],
      {"momentum": 0.0}, True),
    C("adagrad", "SparseAdagrad",
      dict(lr=0.1, initial_accumulator_value=0.2, eps=1e-3), ["accumulator"],
      {"accumulator": 0.2}, True),
    C("adam", "SparseAdam", dict(ADAM_P, amsgrad=False), ["m", "v"],
      {"m": 0.0, "v": 0.0}, False),
    C("adam_amsgrad", "SparseAdam", dict(ADAM_P, amsgrad=True),
      ["m", "v", "vhat"], {"m": 0.0, "v": 0.0, "vhat": 0.0}, False),
    C("adamw", "SparseAdamW", dict(ADAM_P, amsgrad=False, weight_decay=0.1),
      ["m", "v"], {"m": 0.0, "v": 0.0}, False),
    C("adamw_amsgrad", "SparseAdamW", dict(ADAM_P, amsgrad=True, weight_decay=0.1),
      ["m", "v", "vhat"], {"m": 0.0, "v": 0.0, "vhat": 0.0}, False),
    C("adamax", "SparseAdamax", dict(ADAM_P), ["m", "v"], {"m": 0.0, "v": 0.0},
      True),
    C("adadelta", "SparseAdadelta", dict(lr=0.5, rho=0.9, eps=1e-3),
      ["accum_grad", "accum_var"], {"accum_grad": 0.0, "accum_var": 0.0}, True),
    ftrl_case("ftrl"),
    ftrl_case("ftrl_l1_l2", l1=0.3, l2=0.1),
    ftrl_case("ftrl_shrinkage", l1=0.05, l2=0.1, l2_shrinkage=0.2, beta=0.5),
    ftrl_case("ftrl_lr_power", lr_power=-0.7, l1=0.05, l2=0.1),
    ftrl_case("ftrl_lr_power_zero", lr_power=0.0, l1=0.05, l2=0.1),
    rms_case("rmsprop"),
    rms_case("rmsprop_momentum", momentum=0.9),
    rms_case("rmsprop_centered", centered=True),
    rms_case("rmsprop_centered_momentum", momentum=0.9, centered=True),
]


def tf_ctor(case):
    """(description string, factory) of the TF optimizer for a case."""
    p = case["params"]
    L = tf_keras.optimizers.legacy
    o = case["optimizer"]
    if o == "SparseSgd":
        kw = dict(learning_rate=p["lr"], momentum=0.0)
        cls = L.SGD
    elif o == "SparseMomentum":
        kw = dict(learning_rate=p["lr"], momentum=p["momentum"],
                  nesterov=p["nesterov"])
        cls = L.SGD
    elif o == "SparseAdagrad":
        kw = dict(learning_rate=p["lr"],
                  initial_accumulator_value=p["initial_accumulator_value"],
                  epsilon=p["eps"])
        cls = L.Adagrad
    elif o == "SparseAdam":
        kw = dict(learning_rate=p["lr"], beta_1=p["beta1"], beta_2=p["beta2"],
                  epsilon=p["eps"], amsgrad=p["amsgrad"])
        cls = L.Adam
    elif o == "SparseAdamW":
        kw = dict(learning_rate=p["lr"], weight_decay=p["weight_decay"],
                  beta_1=p["beta1"], beta_2=p["beta2"], epsilon=p["eps"],
                  amsgrad=p["amsgrad"])
        cls = tf_keras.optimizers.AdamW
    elif o == "SparseAdamax":
        kw = dict(learning_rate=p["lr"], beta_1=p["beta1"], beta_2=p["beta2"],
                  epsilon=p["eps"])
        cls = L.Adamax
    elif o == "SparseAdadelta":
        kw = dict(learning_rate=p["lr"], rho=p["rho"], epsilon=p["eps"])
        cls = L.Adadelta
    elif o == "SparseFtrl":
        kw = dict(learning_rate=p["lr"], learning_rate_power=p["lr_power"],
                  initial_accumulator_value=p["initial_accumulator_value"],
                  l1_regularization_strength=p["l1"],
                  l2_regularization_strength=p["l2"],
                  l2_shrinkage_regularization_strength=p["l2_shrinkage"],
                  beta=p["beta"])
        cls = L.Ftrl
    elif o == "SparseRmsProp":
        kw = dict(learning_rate=p["lr"], rho=p["rho"], momentum=p["momentum"],
                  epsilon=p["eps"], centered=p["centered"])
        cls = L.RMSprop
    else:
        raise ValueError(o)
    mod = ("tf_keras.optimizers.AdamW" if cls is tf_keras.optimizers.AdamW
           else "tf_keras.optimizers.legacy." + cls.__name__)
    desc = mod + "(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"
    return desc, (lambda: cls(**kw))


NEW_SLOT_ATTR = {"m": "_momentums", "v": "_velocities", "vhat": "_velocity_hats"}


def unique_first(ids):
    uniq, pos = [], []
    for i in ids:
        if i not in uniq:
            uniq.append(i)
        pos.append(uniq.index(i))
    return uniq, pos


# --------------------------------------------------------------------------
# The emulation with real TF.
def run_tf_wrapper(case):
    desc, make = tf_ctor(case)
    is_new = case["optimizer"] == "SparseAdamW"
    table = INIT.copy()
    slots = {s: np.full((len(IDS), DIM), f32(case["slot_initial"][s]),
                        dtype=np.float32) for s in case["slots"]}
    opt = None if is_new else make()
    after = []
    for step, (ids, grads) in enumerate(zip(STEP_IDS, GRADS)):
        uniq, pos = unique_first(ids)
        rows = [ROW[i] for i in uniq]
        wrapper = tf.Variable(table[rows], dtype=tf.float32)
        if is_new:
            # The Keras 2.11+ optimizer cannot take new variables after
            # build(): use a fresh one per step, with the global iteration.
            opt = make()
            opt.iterations.assign(step)
            opt.build([wrapper])
            for s in case["slots"]:
                getattr(opt, NEW_SLOT_ATTR[s])[0].assign(slots[s][rows])
        else:
            for s in case["slots"]:
                opt.add_slot(wrapper, s,
                             initializer=tf.constant(slots[s][rows]))
            assert int(opt.iterations.numpy()) == step
            opt.iterations.assign(step)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(
                tf.gather(wrapper, tf.constant(pos, tf.int64)) *
                tf.constant(grads))
        g = tape.gradient(loss, wrapper)
        assert isinstance(g, tf.IndexedSlices), type(g)
        assert np.array_equal(g.values.numpy(), grads)
        assert list(g.indices.numpy()) == pos
        opt.apply_gradients([(g, wrapper)])
        assert int(opt.iterations.numpy()) == step + 1
        table[rows] = wrapper.numpy()
        for s in case["slots"]:
            if is_new:
                sv = getattr(opt, NEW_SLOT_ATTR[s])[0]
            else:
                sv = opt.get_slot(wrapper, s)
            slots[s][rows] = sv.numpy()
        after.append({"values": table.copy(),
                      "slots": {s: slots[s].copy() for s in case["slots"]}})
    return desc, after


def run_tf_dense(case):
    """Same IndexedSlices on one dense variable for the whole table."""
    _, make = tf_ctor(case)
    opt = make()
    var = tf.Variable(INIT.copy(), dtype=tf.float32)
    after = []
    for ids, grads in zip(STEP_IDS, GRADS):
        sl = tf.IndexedSlices(tf.constant(grads),
                              tf.constant([ROW[i] for i in ids], tf.int64),
                              tf.constant([len(IDS), DIM], tf.int64))
        opt.apply_gradients([(sl, var)])
        after.append({"values": var.numpy(),
                      "slots": {s: opt.get_slot(var, s).numpy()
                                for s in case["slots"]}})
    return after


# --------------------------------------------------------------------------
# Independent numpy float32 re-implementation of the per-row formulas
# (the written spec).  `g` is the per-unique-id summed gradient, summed in
# occurrence order starting from 0 (tf.unique + unsorted_segment_sum).
def rsqrt(x):
    return f32(1) / np.sqrt(x)


def ref_run(case):
    p = {k: (f32(v) if isinstance(v, float) else v)
         for k, v in case["params"].items()}
    o = case["optimizer"]
    table = INIT.copy()
    S = {s: np.full((len(IDS), DIM), f32(case["slot_initial"][s]),
                    dtype=np.float32) for s in case["slots"]}
    one = f32(1)
    after = []
    for step, (ids, grads) in enumerate(zip(STEP_IDS, GRADS)):
        t = f32(step + 1)
        if o == "SparseSgd":
            # No dedup: ResourceScatterAdd of -(g*lr), occurrence by occurrence.
            for i, gi in zip(ids, grads):
                r = ROW[i]
                table[r] = table[r] + (-(gi * p["lr"]))
            after.append({"values": table.copy(), "slots": {}})
            continue
        uniq, pos = unique_first(ids)
        gs = np.zeros((len(uniq), DIM), np.float32)
        for k, gi in zip(pos, grads):
            gs[k] = gs[k] + gi
        for i, g in zip(uniq, gs):
            r = ROW[i]
            w = table[r]
            if o == "SparseMomentum":
                a = S["momentum"][r] * p["momentum"] - g * p["lr"]
                S["momentum"][r] = a
                if p["nesterov"]:
                    w = w + (a * p["momentum"] - g * p["lr"])
                else:
                    w = w + a
            elif o == "SparseAdagrad":
                a = S["accumulator"][r] + g * g
                S["accumulator"][r] = a
                w = w - (p["lr"] * g) / (np.sqrt(a) + p["eps"])
            elif o == "SparseAdam":
                b1p = powf(p["beta1"], t)
                b2p = powf(p["beta2"], t)
                lr_t = p["lr"] * (np.sqrt(one - b2p) / (one - b1p))
                m = S["m"][r] * p["beta1"] + g * (one - p["beta1"])
                v = S["v"][r] * p["beta2"] + (g * g) * (one - p["beta2"])
                S["m"][r], S["v"][r] = m, v
                if p["amsgrad"]:
                    vh = np.maximum(S["vhat"][r], v)
                    S["vhat"][r] = vh
                    v = vh
                w = w - (lr_t * m) / (np.sqrt(v) + p["eps"])
            elif o == "SparseAdamW":
                # Coefficients exactly as TF forms them: python doubles
                # rounded to f32 for (1 - beta); beta^t from f32(beta).
                c1 = f32(1.0 - case["params"]["beta1"])
                c2 = f32(1.0 - case["params"]["beta2"])
                b1p = powf(p["beta1"], t)
                b2p = powf(p["beta2"], t)
                alpha = (p["lr"] * np.sqrt(one - b2p)) / (one - b1p)
                w = w - (w * p["weight_decay"]) * p["lr"]
                m = S["m"][r]
                m = m + (-(m * c1))
                m = m + g * c1
                v = S["v"][r]
                v = v + (-(v * c2))
                v = v + (g * g) * c2
                S["m"][r], S["v"][r] = m, v
                if p["amsgrad"]:
                    vh = np.maximum(S["vhat"][r], v)
                    S["vhat"][r] = vh
                    v = vh
                w = w - (m * alpha) / (np.sqrt(v) + p["eps"])
            elif o == "SparseAdamax":
                b1p = powf(p["beta1"], t)
                neg_scaled_lr = (-p["lr"]) / (one - b1p)
                m = S["m"][r] * p["beta1"] + g * (one - p["beta1"])
                v = np.maximum(S["v"][r] * p["beta2"], np.abs(g))
                S["m"][r], S["v"][r] = m, v
                w = w + neg_scaled_lr * (m / (v + p["eps"]))
            elif o == "SparseAdadelta":
                omr = one - p["rho"]
                acc = S["accum_grad"][r] * p["rho"] + (g * g) * omr
                au = S["accum_var"][r]
                upd = (np.sqrt(au + p["eps"]) * rsqrt(acc + p["eps"])) * g
                w = w - upd * p["lr"]
                S["accum_grad"][r] = acc
                S["accum_var"][r] = au * p["rho"] + (upd * upd) * omr
            elif o == "SparseFtrl":
                lr = p["lr"]
                l2_adj = p["l2"] + p["beta"] / (f32(2) * lr)
                acc = S["accumulator"][r]
                lin = S["linear"][r]
                if case["params"]["l2_shrinkage"] > 0:
                    gsh = g + (f32(2) * p["l2_shrinkage"]) * w
                else:
                    gsh = g
                na = acc + g * g
                if case["params"]["lr_power"] == -0.5:
                    pa, pn = np.sqrt(acc), np.sqrt(na)
                else:
                    pa = powf_arr(acc, -p["lr_power"])
                    pn = powf_arr(na, -p["lr_power"])
                sigma = (pn - pa) / lr
                lin = lin + (gsh - sigma * w)
                # Eigen cwiseMin(l1).cwiseMax(-l1): min(a,b) = b < a ? b : a,
                # max(a,b) = a < b ? b : a (matters only for the sign of 0).
                lo = np.where(p["l1"] < lin, p["l1"], lin)
                clamped = np.where(lo < -p["l1"], -p["l1"], lo)
                x = clamped - lin
                y = pn / lr + f32(2) * l2_adj
                w = x / y
                S["accumulator"][r] = acc + g * g
                S["linear"][r] = lin
            elif o == "SparseRmsProp":
                omr = one - p["rho"]
                ms = S["rms"][r] * p["rho"] + (g * g) * omr
                S["rms"][r] = ms
                if p["momentum"] > 0:  # C++ kernels, eps inside the sqrt
                    if p["centered"]:
                        mg = S["mg"][r] * p["rho"] + g * omr
                        S["mg"][r] = mg
                        denom = (ms + p["eps"]) - mg * mg
                    else:
                        denom = ms + p["eps"]
                    mom = (S["momentum"][r] * p["momentum"] +
                           (rsqrt(denom) * p["lr"]) * g)
                    S["momentum"][r] = mom
                    w = w - mom
                else:  # python path, eps outside the sqrt
                    denom = ms
                    if p["centered"]:
                        mg = S["mg"][r] * p["rho"] + g * omr
                        S["mg"][r] = mg
                        denom = ms - mg * mg
                    w = w + ((-p["lr"]) * g) / (np.sqrt(denom) + p["eps"])
            else:
                raise ValueError(o)
            table[r] = w
        after.append({"values": table.copy(),
                      "slots": {s: S[s].copy() for s in case["slots"]}})
    return after


def compare(a_steps, b_steps):
    """(max abs diff, #elements not bit-identical, #elements)."""
    mx, nbits, n = 0.0, 0, 0
    for a, b in zip(a_steps, b_steps):
        pairs = [(a["values"], b["values"])]
        pairs += [(a["slots"][s], b["slots"][s]) for s in a["slots"]]
        for x, y in pairs:
            assert x.dtype == np.float32 and y.dtype == np.float32
            assert np.all(np.isfinite(x)) and np.all(np.isfinite(y))
            mx = max(mx, float(np.max(np.abs(x.astype(np.float64) - y))))
            nbits += int(np.sum(x.view(np.int32) != y.view(np.int32)))
            n += x.size
    return mx, nbits, n


# --------------------------------------------------------------------------
# JSON writing: shortest decimal that round-trips the float32 value.
def _nearest_f32_direct(s):
    """Correctly rounded decimal -> f32 (ties to even), via exact rationals."""
    q = Fraction(s)
    c = f32(float(s))
    cands = [c, np.nextafter(c, f32(np.inf)), np.nextafter(c, f32(-np.inf))]
    best = min(cands, key=lambda z: (abs(Fraction(float(z)) - q),
                                     int(np.array(z).view(np.int32)) & 1))
    return best


def fmt_f32(x):
    x = f32(x)
    assert np.isfinite(x)
    s = repr(x)  # numpy: shortest repr that round-trips the float32
    if s.startswith("np.float32("):  # numpy >= 2
        s = s[len("np.float32("):-1]
    bits = np.array(x).view(np.int32)
    via64 = np.array(f32(float(s))).view(np.int32)
    direct = np.array(_nearest_f32_direct(s)).view(np.int32)
    if via64 != bits or direct != bits:
        s = repr(float(x))  # fall back to the exact double repr
        assert np.array(f32(float(s))).view(np.int32) == bits
    json.loads(s)
    return s


def dump(obj, indent=0):
    """Small JSON writer: float32 values as shortest round-trip decimals,
    each row of numbers on one line."""
    pad = "  " * indent
    if isinstance(obj, dict):
        items = [f'{pad}  {json.dumps(k)}: {dump(v, indent + 1).lstrip()}'
                 for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, np.ndarray):
        obj = obj.tolist() if obj.dtype != np.float32 else list(obj)
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(e, (list, tuple, dict, np.ndarray)) for e in obj):
            return pad + "[" + ",".join(dump(e) for e in obj) + "]"
        return (pad + "[\n" + ",\n".join(dump(e, indent + 1) for e in obj) +
                "\n" + pad + "]")
    if isinstance(obj, (bool, np.bool_)):
        return pad + ("true" if obj else "false")
    if isinstance(obj, (int, np.integer)):
        return pad + str(int(obj))
    if isinstance(obj, (float, np.floating)):
        return pad + fmt_f32(obj)
    if isinstance(obj, str):
        return pad + json.dumps(obj)
    raise TypeError(type(obj))


def rows(a):
    return [np.asarray(r, dtype=np.float32) for r in a]


# --------------------------------------------------------------------------
def main():
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)

    # TF's scalar tf.pow (used for beta^t) equals libm powf.
    for b in (0.8, 0.95, 0.9, 0.999):
        for t in range(1, 101):
            a = tf.pow(tf.constant(b, tf.float32),
                       tf.cast(tf.constant(t, tf.int64), tf.float32)).numpy()
            assert a == powf(b, t), (b, t)

    report = []
    out_cases = []
    for case in CASES:
        desc, after = run_tf_wrapper(case)
        # 42 (never in a batch) keeps its initial row and slots.
        r42 = ROW[42]
        for st in after:
            assert np.array_equal(st["values"][r42], INIT[r42])
            for s in case["slots"]:
                assert np.all(st["slots"][s][r42] == f32(case["slot_initial"][s]))
        line = {"case": case["name"]}
        if case["tf_lazy"]:
            dense = run_tf_dense(case)
            mx, nb, n = compare(after, dense)
            assert mx == 0.0 and nb == 0, (case["name"], mx, nb)
            line["dense_vs_wrapper_max_abs"] = mx
        mx, nb, n = compare(after, ref_run(case))
        line.update(spec_max_abs=mx, spec_not_bitwise=nb, spec_elems=n)
        assert mx <= 1e-6, (case["name"], mx)
        report.append(line)
        out_cases.append({
            "name": case["name"],
            "optimizer": case["optimizer"],
            "params": case["params"],
            "slot_initial": case["slot_initial"],
            "tf_optimizer": desc,
            "after_steps": [
                {"values": rows(st["values"]),
                 "slots": {s: rows(st["slots"][s]) for s in case["slots"]}}
                for st in after],
        })

    doc = {
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
        "numpy": np.__version__,
        "dim": DIM,
        "ids": IDS,
        "initial_values": rows(INIT),
        "steps": [{"ids": ids, "grads": rows(g)}
                  for ids, g in zip(STEP_IDS, GRADS)],
        "cases": out_cases,
    }
    text = dump(doc) + "\n"
    parsed = json.loads(text)
    # Round-trip check of every float32 written.
    for c_out, c_in in zip(parsed["cases"], out_cases):
        for a, b in zip(c_out["after_steps"], c_in["after_steps"]):
            assert np.array_equal(np.array(a["values"], np.float32),
                                  np.array(b["values"]))
            for s in b["slots"]:
                assert np.array_equal(np.array(a["slots"][s], np.float32),
                                      np.array(b["slots"][s]))
    with open(OUT, "w") as f:
        f.write(text)

    for line in report:
        print(json.dumps(line))
    print(f"wrote {OUT} ({len(text)} bytes), tensorflow {tf.__version__}, "
          f"tf_keras {tf_keras.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
