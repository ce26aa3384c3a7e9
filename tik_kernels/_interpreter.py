"""TIK's adjustments to Triton's CPU interpreter, installed by `tik_kernels/_runtime.py` when kernels run there.

Each one either makes the interpreter compute what a GPU computes (a dot that sums K in order, a bool scalar that
broadcasts as a bool, silence where a GPU's masked lanes divide 0 by 0) or takes a faster path to the bits Triton's
own path gives (`tests/kernels/test_interpreter_patches.py` compares each with Triton's). Every function patches
once (a marker on what it installed); those that stand in for a Triton function whose body they rely on read that
body first and leave Triton alone where it no longer has the shape they expect.
"""

from __future__ import annotations


def _order_defined_interpreter_dot() -> None:
    """Make the interpreter's `tl.dot` sum over K in order, the same for every tile shape.

    Triton's interpreter computes a dot with `np.matmul`, whose summation order is the BLAS
    library's and follows the matrix shape: on an AMD EPYC host (OpenBLAS 0.3.31) a 1-row product
    differed from the same row inside a 2-, 3- or 5-row one, so the CPU contract tests' bitwise
    checks (batch invariance, tile changes that must not change bits) failed or passed with the
    machine. Here every output element is `sum_k a[m, k] * b[k, n]`, added k = 0, 1, ... in fp32
    (one rounding per product and per add), then `+ acc`: a function of that element's row and
    column alone, as a K-sequential GPU dot is. Integer and fp8 dots keep Triton's own path
    (integer sums are exact; fp8 never reaches it in TIK).

    How: for a small output tile (at most SMALL_TILE elements, the CPU probes' tiles) every product is formed at once,
    K outermost in a C-ordered array, and summed by one `np.add.reduce` over that outer axis, which numpy walks in
    order (the inner loop runs along the tile, never pairwise along K); slabs of K bound its memory, each slab's first
    products taking the running sum first. A larger tile adds one K-slice at a time (numpy's per-call cost no longer
    dominates there). Both give the same bits as one add per k; the reduction is used only after a check, at install,
    that it does on this numpy (else every tile takes the loop). Linear's CPU probes' dots are 16 x 64 x 16: 64 numpy
    calls each in the loop, two here.
    """
    import math

    import numpy as np
    from triton.runtime import interpreter as it

    original = it.InterpreterBuilder.create_dot
    if getattr(original, "_tik_order_defined", False):
        return
    #: `create_dot`'s tiles summed at once, and the products formed per slab of K (elements)
    SMALL_TILE, SLAB = 4096, 1 << 18

    def as_float(h, dtype):
        if h.dtype.scalar.is_bf16():
            return (h.data.astype(np.uint32) << 16).view(np.float32).astype(dtype)
        return h.data.astype(dtype)

    def by_k(x, y):
        acc = x[..., :, 0:1] * y[..., 0:1, :]
        for k in range(1, x.shape[-1]):
            acc += x[..., :, k:k + 1] * y[..., k:k + 1, :]
        return acc

    def at_once(x, y, slab=SLAB):
        xk = np.moveaxis(x, -1, 0)[..., :, None]  # [K, ..., M, 1]
        yk = np.moveaxis(y, -2, 0)[..., None, :]  # [K, ..., 1, N]
        tile = np.broadcast_shapes(xk.shape[1:], yk.shape[1:])
        step = max(1, slab // max(1, math.prod(tile)))
        acc = None
        for k0 in range(0, x.shape[-1], step):
            xs, ys = xk[k0:k0 + step], yk[k0:k0 + step]
            products = np.empty((xs.shape[0], *tile), dtype=np.result_type(x, y))  # C order: K outermost
            np.multiply(xs, ys, out=products)
            if acc is not None:
                np.add(acc, products[0], out=products[0])  # the running sum first, as `acc += p` adds
            acc = np.add.reduce(products, axis=0)
        return acc

    def reduction_is_ordered() -> bool:
        """Whether `at_once` gives `by_k`'s bits here, on products whose pairwise sum would differ, over several
        slabs, with NaN and signed zeros among them."""
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((3, 16, 200)) * 10.0 ** rng.integers(-6, 6, (3, 16, 200))).astype(np.float32)
        y = rng.standard_normal((3, 200, 8)).astype(np.float32)
        x[0, 0, 5], y[1, 7, 3], x[2, 3, 9] = np.nan, -0.0, np.inf
        with np.errstate(all="ignore"):
            return all(np.array_equal(by_k(x[..., :k], y[..., :k, :]).view(np.uint32),
                                      at_once(x[..., :k], y[..., :k, :], slab).view(np.uint32))
                       for k in (1, 7, 200) for slab in (SLAB, 384 * 7))  # one slab, and slabs of 7

    ordered = reduction_is_ordered()

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = d.data.dtype
        floats = (a.dtype.scalar.is_floating() and b.dtype.scalar.is_floating() and np.issubdtype(out, np.floating)
                  and a.dtype.scalar.primitive_bitwidth > 8 and b.dtype.scalar.primitive_bitwidth > 8)
        if not floats:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        x, y = as_float(a, out), as_float(b, out)
        small = ordered and x.shape[-1] > 1 and x.shape[-2] * y.shape[-1] <= SMALL_TILE
        acc = at_once(x, y) if small else by_k(x, y)
        return it.TensorHandle(acc + d.data, d.dtype.scalar)

    create_dot._tik_order_defined = True
    it.InterpreterBuilder.create_dot = create_dot
    it.interpreter_builder.create_dot = create_dot.__get__(it.interpreter_builder)


def _helpers_without_repatching() -> None:
    """Stop Triton's interpreter from patching `triton.language` again at every call of a `@triton.jit` helper.

    A launch (`GridExecutor.__call__`) patches the language modules its kernel sees (tl, tl.core: their builtins
    become interpreter functions) and keeps them so until it returns. Each call of a helper from inside the kernel
    (`InterpretedFunction.__call__`) then patches them again (`_patch_lang`: an `inspect.getmembers` scan of tl,
    tl.tensor, tl.math, ~1.4 ms), replacing patched members with equivalent ones and never restoring them: the
    attention root's CPU probes made 19,545 such calls. Here a helper whose language modules are patched already in
    the running launch (by the launch, or by an earlier helper call, which Triton never undoes) is called without
    that scan; anything else (the first helper of a launch that sees another module, a call outside a launch) takes
    Triton's own path. Installed only when Triton's helper
    call still has the shape this replaces (else Triton is left alone); the results are the same bits (the patched
    functions are the same), which the CPU contract tests check."""
    import inspect

    from triton.runtime import interpreter as it

    grid_call, helper_call = it.GridExecutor.__call__, it.InterpretedFunction.__call__
    if getattr(helper_call, "_tik_once", False):
        return
    try:
        body = inspect.getsource(helper_call)
    except (OSError, TypeError):
        return
    if "_patch_lang(self.fn)" not in body or "self.rewrite()" not in body or not hasattr(it, "InterpreterError"):
        return
    langs = (it.tl, it.tl.core)
    patched: list[set] = []  # the language modules patched for each launch in progress (innermost last)
    seen: dict = {}

    def modules(fn) -> frozenset:
        key = id(fn)
        if key not in seen:
            seen[key] = (fn, frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs))
        return seen[key][1]

    def launch(self, *args, **kwargs):
        patched.append(set(modules(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        if not patched or not modules(self.fn) <= patched[-1]:
            # Triton's path patches this helper's modules and never restores them: from now on in this launch they
            # are patched too (Triton's standard library, tl.sum and the like, sees tl.core where a kernel sees tl)
            if patched:
                patched[-1] |= modules(self.fn)
            return helper_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise it.InterpreterError(repr(e)) from e

    call._tik_once = True
    call.__wrapped_original__, launch.__wrapped_original__ = helper_call, grid_call  # Triton's own, for the tests
    it.GridExecutor.__call__ = launch
    it.InterpretedFunction.__call__ = call


def _language_patches_replayed() -> None:
    """Patch the language for a launch or a helper from a record instead of a scan.

    Every launch (`GridExecutor.__call__`) patches the language modules its kernel sees (`_patch_lang`: an
    `inspect.getmembers` scan of tl, tl.tensor, tl.math and tl.core's descriptor type, each builtin replaced by an
    interpreter function, ~1 ms) and restores them when it returns, and a helper that sees other modules (the standard
    library's `tl.sum` sees tl.core) patches those, never restored: linear's CPU probes made 68 launches a pass, each
    scanning the same modules again. What a scan sets depends only on the modules it scans and on which of their
    members are builtins at the time, and a patch replaces every builtin of a module at once, so one member per module
    tells that state. Here the first `_patch_lang` for a set of modules in a given state records what it set (object,
    attribute, new value, in order), and a later one for the same modules in the same state makes the same settings
    through Triton's own patch scope, which records the values they replace (a launch restores them as always). The
    new values are the interpreter functions the record's scan built around the same builtins. Installed only when
    Triton's scope still has the shape this relies on; the bits are the same
    (tests/kernels/test_interpreter_patches.py). In-process, the roots' CPU probes: linear 0.80 -> 0.75 s a pass,
    rmsnorm 0.120 -> 0.090 s (the same output bytes)."""
    import inspect

    from triton.runtime import interpreter as it

    patch_lang, scope_cls = getattr(it, "_patch_lang", None), getattr(it, "_LangPatchScope", None)
    if patch_lang is None or scope_cls is None or getattr(patch_lang, "_tik_replay", False):
        return
    try:
        body, scope_body = inspect.getsource(patch_lang), inspect.getsource(scope_cls)
    except (OSError, TypeError):
        return
    tl = it.tl
    descriptor = getattr(tl.core, "tensor_descriptor_base", None)
    if ("_patch_builtin(lang, interpreter_builder, scope)" not in body
            or "def set_attr(self, obj: object, name: str, value: object)" not in scope_body
            or descriptor is None or not all(hasattr(m, "load") for m in (tl, tl.core, descriptor))
            or not hasattr(tl.math, "exp")):
        return
    langs = (tl, tl.core)
    records: dict[tuple, list] = {}  # (the modules, their state) -> the settings, in order

    def state() -> tuple:
        # one member of each module a scan patches: a builtin, or the interpreter function that replaced it
        return (id(tl.load), id(tl.core.load), id(tl.tensor.__add__), id(tl.math.exp), id(descriptor.load))

    def replayed(fn):
        key = (frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs), state())
        record = records.get(key)
        if record is None:
            record, real_set = [], scope_cls.set_attr

            def recording(scope, obj, name, value):
                record.append((obj, name, value))
                real_set(scope, obj, name, value)

            scope_cls.set_attr = recording
            try:
                scope = patch_lang(fn)
            finally:
                scope_cls.set_attr = real_set
            records[key] = record
            return scope
        scope = scope_cls()
        for obj, name, value in record:
            scope.set_attr(obj, name, value)
        return scope

    replayed._tik_replay = True
    replayed.__wrapped_original__ = patch_lang
    it._patch_lang = replayed


def _no_discarded_overflow_checks() -> None:
    """Stop the interpreter from computing integer-overflow checks it then throws away.

    With `sanitize_overflow` on (the interpreter's default), every integer add, sub and mul in a kernel (index and
    pointer arithmetic, mostly) is done a second time in int64 with two comparisons and an `and`, to feed
    `device_assert`; and `device_assert` returns at once unless `debug` is on, which the interpreter's options never
    set. On the GPU the same assert is compiled out without `debug`. So the check is work with no effect: the attention
    root's CPU probes spent ~20% of their time in it. Turned off only while the options say `debug` is off and
    Triton's assert still has that shape (else Triton is left alone); the kernels' values are the same bits."""
    import dataclasses
    import inspect

    from triton.language import semantic
    from triton.runtime import interpreter as it

    builder = getattr(it, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    cls = getattr(semantic, "TritonSemantic", None)
    if options is None or options.debug or not getattr(options, "sanitize_overflow", False) or cls is None:
        return
    try:
        asserts = inspect.getsource(cls.device_assert)
        sanitize = inspect.getsource(cls.binary_op_sanitize_overflow_impl)
    except (AttributeError, OSError, TypeError):
        return
    if "if not self.builder.options.debug" not in asserts or "self.device_assert(" not in sanitize:
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _fast_interpreter_types() -> None:
    """Two of the interpreter's per-operation helpers made cheap, with the same results.

    `_get_np_dtype` (Triton type -> numpy dtype) builds a 19-entry dict at every call, ~180,000 calls in the attention
    root's CPU probes: here its answer is kept per element type. `_convert_float` turns bf16 to fp32 and back through a
    general bit-field routine for every cast; for the casts TIK's kernels make (bf16 <-> fp32, no rounding mode given),
    when no input is subnormal, that routine's result is the plain bit shift (bf16 -> fp32: the 16 bits moved up;
    fp32 -> bf16: the top 16 bits, truncated as Triton's routine does), so that case takes the shift and any other goes
    to Triton's routine (which treats subnormals its own way). `tests/kernels/test_interpreter_patches.py` checks both
    against Triton's own functions: every bf16 value, and fp32 values of every exponent."""
    import inspect

    import numpy as np
    from triton.runtime import interpreter as it

    tl = it.tl
    np_dtype, convert = getattr(it, "_get_np_dtype", None), getattr(it, "_convert_float", None)
    if np_dtype is None or convert is None or getattr(np_dtype, "_tik_fast", False):
        return
    try:
        body = inspect.getsource(convert)
    except (OSError, TypeError):
        return
    if "def _convert_float(input, input_dtype, output_dtype, rounding_mode)" not in body:
        return
    u64 = np.dtype(np.uint64)
    by_name: dict = {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return u64
        found = by_name.get(tt_dtype.name)
        if found is None:
            found = by_name[tt_dtype.name] = np_dtype(tt_dtype)
        return found

    bf16, fp32 = tl.bfloat16, tl.float32

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if rounding_mode is None and input_dtype == bf16 and output_dtype == fp32:
            bits = np.asarray(input).view(np.uint16)
            if not (((bits & 0x7F80) == 0) & ((bits & 0x007F) != 0)).any():
                return bits.astype(np.uint32) << np.uint32(16)
        elif rounding_mode is None and input_dtype == fp32 and output_dtype == bf16:
            bits = np.asarray(input).view(np.uint32)
            if not (((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)).any():
                return (bits >> np.uint32(16)).astype(np.uint16)
        return convert(input, input_dtype, output_dtype, rounding_mode)

    get_np_dtype._tik_fast = convert_float._tik_fast = True
    get_np_dtype.__wrapped_original__, convert_float.__wrapped_original__ = np_dtype, convert
    it._get_np_dtype, it._convert_float = get_np_dtype, convert_float


def _fast_frontend_types() -> None:
    """Triton's language front end made cheaper per operation where the interpreter spends most of its time.

    In the interpreter every `tl` operation of every program goes through the front end's Python: each result is a
    new `tl.tensor` whose `block_type` is rebuilt from its shape (the shape unwrapped element by element, checked,
    turned into a Triton `tuple` whose `tuple_type` is built from a `constexpr_type` per element, then named), and
    each tensor turns the shape into a second Triton tuple of `constexpr`s with its own `tuple_type`; comparing two
    block types normalizes a copy of the other's shape tuple, and every `dtype ==` and shape unwrap passes values
    through `_unwrap_if_constexpr`'s chain of `isinstance` tests. In the attention root's CPU probes that was about
    half of the time (some 400,000 tensors and 270,000 block types), the numpy compute being a small part. Here:

    - `block_type(element_ty, shape)` with a `list` or Triton `tuple` of plain ints takes what depends on the shape
      alone (its `tuple_type`, element count and printed form) from the first block type built with that shape, which
      Triton's own constructor built and checked; each block type still gets its own shape tuple (the same ints, the
      same kind of `tuple_type`), its element type and name as Triton makes them. Any other shape takes Triton's path.
    - `tensor(handle, type)` takes its shape tuple's `constexpr`s, their `tuple_type` and its `numel` from the first
      tensor of that block shape (the shape's ints are the key; `constexpr`s are never changed after they are made,
      so sharing them is sharing equal immutable values); a new Triton tuple per tensor, as Triton makes.
    - `block_type == block_type` compares the two shapes' int lists directly (`constexpr` of the comparison, as
      Triton's tuple comparison returns), after the same element-type comparison.
    - `_unwrap_if_constexpr` returns a value of an exact type that none of its branches unwraps (int, float, bool,
      None, str, a tensor, a dtype) at once, and a `constexpr`'s value at once; anything else goes to Triton's.
    - `broadcast_impl_value` of two block tensors of the same shape returns them, as Triton's does after finding
      that neither shape changes (its comparison of the shapes as Triton tuples was most of its cost).
    - `binary_op_type_checking_impl` (every `+`, `*`, `<`, ... of a kernel) of the pairings met most, each reduced
      to the casts and the broadcast Triton's rules give it: one dtype on both sides (at any shapes), signed
      integers of two widths (the wider), a pointer plus an integer tensor, a Python number beside an int or fp32
      tensor (a constant of the tensor's dtype). Anything else, and any input that Triton refuses, takes Triton's
      path (`test_fast_binary_type_checks_match_tritons` compares both over every pairing of eight dtypes, five
      shapes and twelve numbers).

    Each fast path returns what Triton's path returns for that input (the same values, the same types by `==`); the
    kernels' results are the same bits (`tests/kernels/test_interpreter_patches.py` runs a kernel with and without
    them and checks the types made against Triton's). Installed only when the classes still have the shapes this
    relies on (Triton 3.9's), else Triton is left alone."""
    import builtins
    import inspect

    from triton.language import core, semantic

    block_type, tensor, ttuple = core.block_type, core.tensor, core.tuple
    constexpr, dtype = core.constexpr, core.dtype
    if getattr(block_type.__init__, "_tik_fast", False):
        return
    try:
        sources = {name: inspect.getsource(fn) for name, fn in (
            ("block", block_type.__init__), ("block_eq", block_type.__eq__), ("tensor", tensor.__init__),
            ("tuple", ttuple.__init__), ("unwrap", core._unwrap_if_constexpr),
            ("broadcast", semantic.TritonSemantic.broadcast_impl_value),
            ("cast", semantic.TritonSemantic.cast), ("dtype_eq", dtype.__eq__),
            ("binary", semantic.TritonSemantic.binary_op_type_checking_impl),
            ("computation", semantic.TritonSemantic.computation_type_impl))}
    except (AttributeError, OSError, TypeError):
        return
    expected = {
        "block": ("self.shape = tuple(_unwrap_shape(shape))", "self.numel = validate_block_shape(self.shape)",
                  "self.name = f'<{self.shape}, {self.element_ty}>'"),
        "block_eq": ("return self.element_ty == other.element_ty and self.shape == other.shape",),
        "tensor": ("self.numel = constexpr(math.prod(self.shape))", "self.dtype = type.scalar",
                   "self.shape = tuple([constexpr(s) for s in self.shape])"),
        "tuple": ("self.type = _type_for_tuple_values(self.values)",),
        "unwrap": ("return o.value if isinstance(o, constexpr) else o",),
        "broadcast": ("if lhs_shape != ret_shape:", "if rhs_shape != ret_shape:"),
        "cast": ("def cast(self, input: TensorTy, dst_ty: tl.dtype, fp_downcast_rounding: Optional[str] = None)",
                 "if src_sca_ty == dst_sca_ty:\n            return input",
                 "if src_ty.is_block():\n            dst_ty = src_ty.with_element_ty(dst_sca_ty)",
                 "if fp_downcast_rounding is None: fp_downcast_rounding = ir.ROUNDING_MODE.RTNE",
                 "sign_extend = src_sca_ty.is_int_signed() and not src_sca_ty.is_bool()",
                 "self.builder.create_int_cast(input.handle, dst_ty.to_ir(self.builder), sign_extend), dst_ty)",
                 "self.builder.create_fp_trunc(input.handle, dst_ty.to_ir(self.builder)), dst_ty)",
                 "self.builder.create_fp_ext(input.handle, dst_ty.to_ir(self.builder)), dst_ty)"),
        "dtype_eq": ("return self.name == other.name",),
        "binary": ("ret_sca_ty = self.computation_type_impl(lhs_sca_ty, lhs_is_scalar, rhs_sca_ty, rhs_is_scalar, "
                   "div_or_mod)", "lhs, rhs = self.broadcast_impl_value(lhs, rhs)"),
        "computation": ("if div_or_mod and (a_ty.is_floating() or b_ty.is_floating()):\n            return tl.float32",
                        "return a_ty if a_ty == b_ty else tl.float16", "return self.integer_promote_impl(a_ty, b_ty)"),
    }
    if any(line not in sources[k] for k, lines in expected.items() for line in lines):
        return
    leaves = (int, float, bool, type(None), str, tensor, dtype, block_type, core.pointer_type)
    if any(issubclass(t, (list, builtins.tuple, ttuple, constexpr)) for t in leaves):
        return

    block_init, block_eq, tensor_init = block_type.__init__, block_type.__eq__, tensor.__init__
    unwrap, broadcast = core._unwrap_if_constexpr, semantic.TritonSemantic.broadcast_impl_value
    cast, binary_types = semantic.TritonSemantic.cast, semantic.TritonSemantic.binary_op_type_checking_impl
    int_kinds = frozenset((int,) * n for n in range(1, 9))
    shapes: dict = {}  # shape ints -> (tuple_type, numel, printed shape), from Triton's own block_type
    tensor_shapes: dict = {}  # shape ints -> (constexprs, their tuple_type, numel constexpr), from Triton's tensor

    def fast_block_init(self, element_ty, shape):
        kind = type(shape)
        values = shape if kind is list else shape.values if kind is ttuple else None
        key = builtins.tuple(values) if values is not None else None
        if key is None or builtins.tuple(map(type, key)) not in int_kinds:  # ints only: 16.0 == 16 is no shape
            return block_init(self, element_ty, shape)
        found = shapes.get(key)
        if found is None:
            block_init(self, element_ty, shape)  # Triton's checks; raises for a shape it refuses, caching nothing
            shapes[key] = (self.shape.type, self.numel, str(self.shape))
            return
        types, numel, printed = found
        self.element_ty = element_ty
        self.shape = ttuple(list(key), types)
        self.numel = numel
        self.name = f'<{printed}, {element_ty}>'

    def fast_block_eq(self, other):
        if type(self) is not block_type or type(other) is not block_type:
            return block_eq(self, other)
        return self.element_ty == other.element_ty and constexpr(self.shape.values == other.shape.values)

    def fast_tensor_init(self, handle, type):
        if type.is_block():
            shape = type.shape
            if builtins.type(shape) is not ttuple:
                return tensor_init(self, handle, type)
            key = builtins.tuple(shape.values)
        else:
            key = ()
        found = tensor_shapes.get(key)
        if found is None:
            tensor_init(self, handle, type)
            tensor_shapes[key] = (builtins.tuple(self.shape.values), self.shape.type, self.numel)
            return
        values, types, numel = found
        self.handle = handle
        self.numel = numel
        self.type = type
        self.dtype = type.scalar
        self.shape = ttuple(list(values), types)

    def fast_unwrap(o):
        kind = type(o)
        if kind is constexpr:
            return o.value
        if kind in leaf_set:
            return o
        return unwrap(o)

    leaf_set = frozenset(leaves)

    def fast_broadcast(self, lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        if (type(lhs_ty) is block_type and type(rhs_ty) is block_type and type(lhs_ty.shape) is ttuple
                and type(rhs_ty.shape) is ttuple):
            lhs_shape, rhs_shape = lhs_ty.shape.values, rhs_ty.shape.values
            if lhs_shape == rhs_shape:
                return lhs, rhs
            if len(lhs_shape) != len(rhs_shape):
                return broadcast(self, lhs, rhs)
            # Triton's loop over equal ranks, on the shapes' ints
            ret_shape = []
            for left, right in zip(lhs_shape, rhs_shape, strict=True):
                if left == 1:
                    ret_shape.append(right)
                elif right == 1 or right == left:
                    ret_shape.append(left)
                else:
                    return broadcast(self, lhs, rhs)  # Triton's error
            if lhs_shape != ret_shape:
                lhs = self.make_tensor(self.builder.create_broadcast(lhs.handle, ret_shape),
                                       block_type(lhs_ty.scalar, ret_shape))
            if rhs_shape != ret_shape:
                rhs = self.make_tensor(self.builder.create_broadcast(rhs.handle, ret_shape),
                                       block_type(rhs_ty.scalar, ret_shape))
            return lhs, rhs
        if not lhs_ty.is_block() and not rhs_ty.is_block():
            return lhs, rhs  # (scalar, scalar): Triton returns them
        return broadcast(self, lhs, rhs)

    def fast_binary_types(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
                          div_or_mod=False):
        # Triton's function: the computation type (`computation_type_impl`), both operands cast to it
        # (`_cast_to_computation_type`), then broadcast. Here the cases an interpreted kernel meets most, each giving
        # what that gives: no check of Triton's can fail in them, every cast returns its input or is a constant of the
        # computation type, and the broadcast is the same (fast) `broadcast_impl_value`. Anything else: Triton's.
        kl, kr = type(lhs), type(rhs)
        if arithmetic_check and kl is tensor and kr is tensor:
            a, b = lhs.dtype, rhs.dtype
            if type(a) is dtype and type(b) is dtype and a.name == b.name:
                # one plain dtype: every rule of `computation_type_impl` gives it back (integers of one signedness
                # promote to their own type; floats but a div or mod of those narrower than fp32, which goes to
                # Triton's), both casts return their input
                if a.is_int() or a.is_fp32() or a.is_fp64() or (a.is_floating() and not div_or_mod):
                    lhs_ty, rhs_ty = lhs.type, rhs.type
                    if ((type(lhs_ty) is block_type and type(rhs_ty) is block_type and type(lhs_ty.shape) is ttuple
                         and type(rhs_ty.shape) is ttuple and lhs_ty.shape.values == rhs_ty.shape.values)
                            or (not lhs_ty.is_block() and not rhs_ty.is_block())):
                        return lhs, rhs  # and the broadcast returns both
                    return self.broadcast_impl_value(lhs, rhs)
            elif (type(a) is dtype and type(b) is dtype and a.is_int_signed() and b.is_int_signed()
                  and a.int_bitwidth != b.int_bitwidth):
                # signed integers of two widths (an int64 offset with an int32 index): the wider one, both cast to it
                ret = a if a.int_bitwidth > b.int_bitwidth else b
                return self.broadcast_impl_value(self.cast(lhs, ret), self.cast(rhs, ret))
        if kl is tensor and kr is tensor:
            # a pointer plus an integer tensor where the pointer side is allowed: Triton's checks pass, no arithmetic
            # type is computed (the pointer leaves it out), and the pair is broadcast as it is
            a, b = lhs.dtype, rhs.dtype
            if ((allow_lhs_ptr and type(a) is core.pointer_type and type(b) is dtype and b.is_int())
                    or (allow_rhs_ptr and type(b) is core.pointer_type and type(a) is dtype and a.is_int())):
                return self.broadcast_impl_value(lhs, rhs)
        elif arithmetic_check and (kl is tensor) != (kr is tensor):
            t, value = (lhs, rhs) if kl is tensor else (rhs, lhs)
            kind = type(value)
            ty = t.dtype
            if type(ty) is dtype and (kind is int or kind is float):
                # a Python number beside a tensor: never above the tensor's kind here (an int beside an int or a
                # float tensor, a float beside a float one), so it does not take part in the promotion and the
                # computation type is the tensor's dtype; the number becomes a constant of it (Triton's range check
                # for an int dtype: a number outside goes to Triton's, which raises)
                if ty.is_int_signed() and kind is int:
                    fits = ty.get_int_min_value() <= value <= ty.get_int_max_value()
                elif ty.is_fp32():
                    fits = True  # fp32 for a div or mod too
                else:
                    fits = False
                if fits:
                    c = self.scalar_constant(value, dtype=ty)
                    return self.broadcast_impl_value(t, c) if kl is tensor else self.broadcast_impl_value(c, t)
        return binary_types(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    ints = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    #: (source, destination) dtype names -> the one builder call Triton's `cast` reaches for them without a rounding
    #: mode: integers (not bool) to another width or signedness; bf16 / fp16 to fp32 and fp32 to fp64 (extensions; a
    #: bf16 or fp16 to anything but fp32 goes through fp32 in Triton, so not here); fp32 to bf16 / fp16 and fp64 to
    #: fp32 (truncations: no mode means round-to-nearest-even, which Triton's `create_fp_trunc` is, given no mode)
    direct_casts = {**{(a, b): "int" for a in ints for b in ints if a != b},
                    **dict.fromkeys((("bf16", "fp32"), ("fp16", "fp32"), ("fp32", "fp64")), "ext"),
                    **dict.fromkeys((("fp32", "bf16"), ("fp32", "fp16"), ("fp64", "fp32")), "trunc")}

    def fast_cast(self, input, dst_ty, fp_downcast_rounding=None):
        src, dst = input.type.scalar, dst_ty.scalar
        if type(src) is dtype and type(dst) is dtype:
            if src.name == dst.name:
                return input  # Triton's `src_sca_ty == dst_sca_ty` (names, for plain dtypes): the input unchanged
            kind = direct_casts.get((src.name, dst.name)) if fp_downcast_rounding is None else None
            if kind is not None:
                # Triton's path for these: the block's type with the new element type, none of its float checks
                # applies, then this one call
                if input.type.is_block():
                    dst_ty = input.type.with_element_ty(dst)
                ir_ty = dst_ty.to_ir(self.builder)
                if kind == "int":
                    handle = self.builder.create_int_cast(input.handle, ir_ty, src.is_int_signed())
                elif kind == "ext":
                    handle = self.builder.create_fp_ext(input.handle, ir_ty)
                else:
                    handle = self.builder.create_fp_trunc(input.handle, ir_ty)
                return self.make_tensor(handle, dst_ty)
        return cast(self, input, dst_ty, fp_downcast_rounding)

    for fn, original in ((fast_block_init, block_init), (fast_block_eq, block_eq), (fast_tensor_init, tensor_init),
                         (fast_unwrap, unwrap), (fast_broadcast, broadcast), (fast_cast, cast),
                         (fast_binary_types, binary_types)):
        fn._tik_fast = True
        fn.__wrapped_original__ = original
    block_type.__init__, block_type.__eq__, tensor.__init__ = fast_block_init, fast_block_eq, fast_tensor_init
    semantic.TritonSemantic.broadcast_impl_value, semantic.TritonSemantic.cast = fast_broadcast, fast_cast
    semantic.TritonSemantic.binary_op_type_checking_impl = fast_binary_types
    import sys
    for name, module in list(sys.modules.items()):  # every module that imported Triton's function by name
        if name.startswith("triton.") and getattr(module, "_unwrap_if_constexpr", None) is unwrap:
            module._unwrap_if_constexpr = fast_unwrap


def _direct_builtin_calls() -> None:
    """Call a patched `tl` builtin with one Python frame less and no copy of its keyword arguments.

    A launch replaces each builtin of the language modules (`tl.load`, `tensor.__add__`, ...) with a lambda that
    copies its keyword arguments without `_semantic` and calls the builtin with `_semantic=interpreter_semantic`; the
    builtin is `triton.language.core.builtin`'s wrapper, which only checks that `_semantic` was given and calls the
    function. The attention root's CPU probes made some 350,000 such calls. Here the replacement sets `_semantic` in
    its own keyword dict (a fresh one at every call, as Python makes it) and, for a member that is exactly that wrapper
    (same code object), calls the wrapped function directly: the wrapper's check always passes there, so the call
    and its result are the same. Installed only when Triton's `_patch_attr` and `builtin` still have that shape."""
    import inspect

    from triton.language import core
    from triton.runtime import interpreter as it

    patch_attr = getattr(it, "_patch_attr", None)
    if patch_attr is None or getattr(patch_attr, "_tik_fast", False):
        return
    try:
        body, wrapper_body = inspect.getsource(patch_attr), inspect.getsource(core.builtin)
    except (OSError, TypeError):
        return
    if ('if k != "_semantic"}, _semantic=interpreter_semantic))' not in body
            or "scope.set_attr(obj, name, new_member)" not in body
            or 'if "_semantic" not in kwargs or kwargs["_semantic"] is None:' not in wrapper_body
            or "return fn(*args, **kwargs)" not in wrapper_body):
        return
    wrapper_code = core.builtin(lambda *a, **k: None).__code__

    def fast_patch_attr(obj, name, member, builder, scope):
        target = member
        if getattr(member, "__code__", None) is wrapper_code and callable(getattr(member, "__wrapped__", None)):
            target = member.__wrapped__

        def new_member(*args, member=target, **kwargs):
            kwargs["_semantic"] = it.interpreter_semantic
            return member(*args, **kwargs)

        scope.set_attr(obj, name, new_member)

    fast_patch_attr._tik_fast = True
    fast_patch_attr.__wrapped_original__ = patch_attr
    it._patch_attr = fast_patch_attr


def _bool_splats() -> None:
    """Triton's interpreter broadcasts a scalar comparison (`pid < n`, a bool) into the dtype of the values it compared
    (`np.full(..., dtype=int64)`), so a mask made of a block and such a scalar, `(o < T) & (pid < n)`, reached
    `tl.store` as integers and was refused ("mask has unsupported dtype", Triton 3.9 here), while the GPU compiles
    it. A candidate using that idiom failed on the CPU only. Here a bool broadcasts as a bool."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    original = it.InterpreterBuilder.create_splat
    if getattr(original, "_tik_bool_splat", False):
        return

    def create_splat(self, ret_ty, arg):
        data = arg.data
        if getattr(data, "dtype", None) != np.bool_:
            return original(self, ret_ty, arg)
        value = data[0] if isinstance(arg.dtype, tl.block_type) or np.ndim(data) else data
        return it.TensorHandle(np.full(ret_ty.shape, value, dtype=np.bool_), tl.int1)

    create_splat._tik_bool_splat = True
    it.InterpreterBuilder.create_splat = create_splat


def _quiet_float_warnings() -> None:
    """numpy's floating-point warnings silenced while the interpreter runs a launch. A GPU computes every lane of a
    block, the masked ones too, and says nothing of a 0 / 0 or an overflow there (IEEE results, never stored): the
    decode kernel's chunk merge divides by the empty rows' l = 0, and `tik e2e` on the CPU printed numpy's "invalid
    value encountered in divide" in the middle of its progress lines. The values are numpy's either way."""
    import numpy as np
    from triton.runtime import interpreter as it

    grid_call = it.GridExecutor.__call__
    if getattr(grid_call, "_tik_quiet", False):
        return

    def launch(self, *args, **kwargs):
        with np.errstate(all="ignore"):
            return grid_call(self, *args, **kwargs)

    launch._tik_quiet = True
    launch.__wrapped_original__ = grid_call
    it.GridExecutor.__call__ = launch


def install() -> None:
    """Every adjustment, in the order they wrap one another."""
    _order_defined_interpreter_dot()
    _bool_splats()
    _helpers_without_repatching()
    _language_patches_replayed()
    _no_discarded_overflow_checks()
    _fast_interpreter_types()
    _fast_frontend_types()
    _direct_builtin_calls()
    _quiet_float_warnings()
