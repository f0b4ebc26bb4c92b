"""The op vocabulary, declared once: every pass and every kernel renderer reads it.

``Op`` names the IR's operations; each has one frozen dataclass of typed attributes
(``Source``, ``Map``, ``Reduce``, ...), which ``Node.attrs`` holds. ``ELEMENTWISE`` is the one
table of elementwise functions a ``Map`` may apply, each with its arity, its NumPy
function, its cost class (transcendental calls per element) and its numexpr rendering;
``REDUCTIONS`` the reductions, with how their partial results combine. The numba row
loop renders the same names from its own table of ``ast`` rules (``kernels.rowloop``), and
a test checks it covers this one.

=========  ==============  ==================================================================
op         attrs           meaning
=========  ==============  ==================================================================
source     ``Source``      a stored Zarr array (and a check each block must pass)
value      ``Value``       a driver array bound by name at run time (weights)
const      ``Const``       a 0-d constant
cached     ``Cached``      blocks kept by the executor (``Session.persist``)
map        ``Map``         elementwise function of its inputs, broadcast
reduce     ``Reduce``      sum / max / min / argmax / argmin over axes
einsum     ``Einsum``      contraction, e.g. "ij,j->i" (matmul, tensordot)
transpose  ``Transpose``   a view with permuted axes
blockwise  ``Blockwise``   one output of a job's block function on matching row blocks
store      ``Store``       write the input's blocks into a Zarr array; the value is
                           [bytes written, PUT requests]
=========  ==============  ==================================================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from arrayjob.io.locations import ArrayInfo, StorageOptions, TableTarget
from arrayjob.planner.kernel import Kernel


class Op(enum.StrEnum):
    SOURCE = "source"
    VALUE = "value"
    CONST = "const"
    CACHED = "cached"
    MAP = "map"
    REDUCE = "reduce"
    EINSUM = "einsum"
    TRANSPOSE = "transpose"
    BLOCKWISE = "blockwise"
    STORE = "store"

    @property
    def is_leaf(self) -> bool:
        """A node with no inputs: its blocks exist before the program runs."""
        return self in LEAVES

    @property
    def is_opaque(self) -> bool:
        """Shapes declared, not inferred; never fused with other ops."""
        return self in OPAQUE

    @property
    def from_driver(self) -> bool:
        """A value the driver supplies whole to every task that needs it: never cut, and
        moved by no tiling (a constant is inlined into the kernels)."""
        return self in FROM_DRIVER


LEAVES = frozenset({Op.SOURCE, Op.VALUE, Op.CONST, Op.CACHED})
OPAQUE = frozenset({Op.BLOCKWISE, Op.STORE})
FROM_DRIVER = frozenset({Op.VALUE, Op.CONST})


# -- typed attributes, one dataclass per op ------------------------------------------------


@dataclass(frozen=True)
class Source:
    array: ArrayInfo
    check: Kernel | None = None  # runs where each block is read: None or what is wrong with it

    def label(self) -> str:
        return self.array.name


@dataclass(frozen=True)
class Value:
    name: str

    def label(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const:
    value: float | int | bool

    def label(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Cached:
    handle: str
    block_shape: tuple[int, ...]
    block_bytes: int | None = None  # one block's bytes where the dtype cannot say (object blocks)

    def label(self) -> str:
        return self.handle


@dataclass(frozen=True)
class Map:
    fn: str  # a key of ELEMENTWISE

    def label(self) -> str:
        return self.fn


@dataclass(frozen=True)
class Reduce:
    fn: str  # a key of REDUCTIONS
    axes: tuple[int, ...]
    keepdims: bool = False

    def label(self) -> str:
        return f"{self.fn}({','.join(map(str, self.axes))})"


@dataclass(frozen=True)
class Einsum:
    subscripts: str  # explicit: "ij,j->i"

    @property
    def terms(self) -> tuple[list[str], str]:
        return parse_einsum(self.subscripts)

    def label(self) -> str:
        return f"einsum({self.subscripts})"


@dataclass(frozen=True)
class Transpose:
    perm: tuple[int, ...]

    def label(self) -> str:
        return f"transpose{self.perm}"


@dataclass(frozen=True)
class Blockwise:
    """Output ``output`` of a job's block function applied to matching row blocks."""

    kernel: Kernel
    output: int
    in_rows: tuple[int | None, ...] | None  # rows per block of each input; None: whole inputs
    out_rows: int | None  # rows per block of this output; None: one whole block
    out_block_bytes: int | None = None  # one block's bytes where the dtype cannot say (object blocks)

    def label(self) -> str:
        return f"{self.kernel.name}[{self.output}]"


@dataclass(frozen=True)
class Store:
    target: ArrayInfo | TableTarget  # a Zarr array, or a Parquet dataset of per-row outputs
    options: StorageOptions

    def label(self) -> str:
        return f"store {self.target.name}"


OpAttrs = Source | Value | Const | Cached | Map | Reduce | Einsum | Transpose | Blockwise | Store
ATTRS: dict[Op, type] = {
    Op.SOURCE: Source, Op.VALUE: Value, Op.CONST: Const, Op.CACHED: Cached, Op.MAP: Map,
    Op.REDUCE: Reduce, Op.EINSUM: Einsum, Op.TRANSPOSE: Transpose, Op.BLOCKWISE: Blockwise,
    Op.STORE: Store,
}


def parse_einsum(subscripts: str) -> tuple[list[str], str]:
    """``"ij,j->i"`` -> (["ij", "j"], "i")."""
    lhs, _, out = subscripts.replace(" ", "").partition("->")
    return lhs.split(","), out


# -- elementwise functions -------------------------------------------------------------------


def sigmoid(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(x)


def erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf as _erf

    return _erf(x)


LOG2 = "0.6931471805599453"


@dataclass(frozen=True)
class Elementwise:
    """An elementwise function a ``Map`` applies.

    ``calls``: transcendental calls per element (0 for plain arithmetic); the cost model
    prices each call at the calibrated transcendental rate, the fusion model weighs it.
    ``numexpr``: the numexpr rendering, ``{i}`` the i-th operand (None: NumPy only).
    ``keeps_integers``: integer inputs give an integer result (else float64).
    """

    name: str
    arity: int
    numpy: Callable[..., np.ndarray]
    numexpr: str | None
    calls: int = 0
    comparison: bool = False
    keeps_integers: bool = False
    # f(0) == 0 for every operand being 0 ("all", a unary function) or for any one ("any":
    # multiply): applied to a sparse matrix, the result has its non-zeros and no others
    keeps_zeros: str | None = None


def _table(*entries: Elementwise) -> dict[str, Elementwise]:
    return {e.name: e for e in entries}


ELEMENTWISE: dict[str, Elementwise] = _table(
    Elementwise("negative", 1, np.negative, "(-{0})", keeps_integers=True, keeps_zeros="all"),
    Elementwise("exp", 1, np.exp, "exp({0})", calls=1),
    Elementwise("log", 1, np.log, "log({0})", calls=1),
    Elementwise("log1p", 1, np.log1p, "log1p({0})", calls=1),
    Elementwise("expm1", 1, np.expm1, "expm1({0})", calls=1, keeps_zeros="all"),
    Elementwise("sqrt", 1, np.sqrt, "sqrt({0})", keeps_zeros="all"),
    Elementwise("abs", 1, np.abs, "abs({0})", keeps_integers=True, keeps_zeros="all"),
    Elementwise("square", 1, np.square, "({0}**2)", keeps_integers=True, keeps_zeros="all"),
    Elementwise("tanh", 1, np.tanh, "tanh({0})", calls=1, keeps_zeros="all"),
    Elementwise("sin", 1, np.sin, "sin({0})", calls=1, keeps_zeros="all"),
    Elementwise("cos", 1, np.cos, "cos({0})", calls=1),
    Elementwise("erf", 1, erf, None, calls=1),
    Elementwise("sigmoid", 1, sigmoid, "(1/(1+exp(-{0})))", calls=1),
    Elementwise("reciprocal", 1, np.reciprocal, "(1/{0})"),
    Elementwise("add", 2, np.add, "({0}+{1})", keeps_integers=True),
    Elementwise("subtract", 2, np.subtract, "({0}-{1})", keeps_integers=True),
    Elementwise("multiply", 2, np.multiply, "({0}*{1})", keeps_integers=True, keeps_zeros="any"),
    Elementwise("divide", 2, np.true_divide, "({0}/{1})"),
    Elementwise("power", 2, np.power, "({0}**{1})", calls=1),
    Elementwise("maximum", 2, np.maximum, "maximum({0},{1})", keeps_integers=True),
    Elementwise("minimum", 2, np.minimum, "minimum({0},{1})", keeps_integers=True),
    Elementwise("logaddexp", 2, np.logaddexp,
                f"where({{0}}=={{1}},{{0}}+{LOG2},maximum({{0}},{{1}})+log1p(exp(-abs({{0}}-{{1}}))))",
                calls=2),
    Elementwise("greater", 2, np.greater, "({0}>{1})", comparison=True),
    Elementwise("less", 2, np.less, "({0}<{1})", comparison=True),
    Elementwise("greater_equal", 2, np.greater_equal, "({0}>={1})", comparison=True),
    Elementwise("less_equal", 2, np.less_equal, "({0}<={1})", comparison=True),
    Elementwise("equal", 2, np.equal, "({0}=={1})", comparison=True),
    Elementwise("not_equal", 2, np.not_equal, "({0}!={1})", comparison=True),
    Elementwise("where", 3, np.where, "where({0},{1},{2})", keeps_integers=True),
)
COMPARISONS = frozenset(name for name, e in ELEMENTWISE.items() if e.comparison)


def keeps_sparse(op: Op, attrs: OpAttrs, sparse_inputs: Sequence[bool]) -> bool:
    """Whether the result of ``op`` on these inputs (which of them are sparse) is a sparse
    matrix with non-zeros only where a sparse input has them: a transpose of one, or a map
    that keeps zeros (``Elementwise.keeps_zeros``). The planner sizes such a node by its
    non-zeros (``ir.Sparsity``); the kernels (``kernels.sparse``) compute it without
    densifying. Any other op on a sparse input gives a dense result."""
    if not any(sparse_inputs):
        return False
    if op is Op.TRANSPOSE:
        return True
    if isinstance(attrs, Map):
        keeps = ELEMENTWISE[attrs.fn].keeps_zeros
        return keeps == "any" or (keeps == "all" and all(sparse_inputs))
    return False


# -- reductions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    """A reduction over axes. ``combine``: how partial results over a cut axis combine
    (a ``physical.Combine`` op), or None when they cannot (arg-reductions)."""

    name: str
    combine: str | None
    numpy: Callable[..., np.ndarray]

    @property
    def is_arg(self) -> bool:
        return self.combine is None


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction("sum", "sum", np.sum),
    "max": Reduction("max", "max", np.max),
    "min": Reduction("min", "min", np.min),
    "argmax": Reduction("argmax", None, np.argmax),
    "argmin": Reduction("argmin", None, np.argmin),
}


def combine_of(op: Op, attrs: OpAttrs) -> str | None:
    """How partial results of a node with this op combine (a ``physical.Combine`` op): a
    contraction's and a sum's by adding, max and min by themselves; None for any other op."""
    if op is Op.EINSUM:
        return "sum"
    if op is Op.REDUCE:
        assert isinstance(attrs, Reduce)
        return REDUCTIONS[attrs.fn].combine
    return None
