"""TRAK-style score <phi_target, (Phi^T Phi + lambda I)^-1 phi_z>, Phi the sketches of all rollouts.

lambda = lambda_scale x the mean diagonal of Phi^T Phi (0.1 as in the paper). The primal form solves a
k x k system; the dual form, (Phi Phi^T + lambda I)^-1 Phi phi_target, an n x n one; `form: auto` takes
the smaller. Minus the value, as in tracincp: positive means the rollout's update raised the target.

The regularized inverse (primal) or the kernel (dual) depends on the seed's sketches only, so `prepare`
computes it once per seed and every target kind and draw reuses it.
"""

import numpy as np

from behaviortrace.score.vectors import step_sums

USES_TARGET = True
STEP_AGGREGATE = "sum"
ROWS_PER_BLOCK = 8192


def _blocks(phi: np.ndarray):
    """Row blocks of phi (a memory-mapped matrix is read block by block, never copied whole)."""
    for start in range(0, phi.shape[0], ROWS_PER_BLOCK):
        yield np.asarray(phi[start : start + ROWS_PER_BLOCK])


def ridge(phi: np.ndarray, lambda_scale: float) -> float:
    """lambda_scale x the mean diagonal of Phi^T Phi, the squares summed in float64."""
    total = sum(float(np.square(block, dtype=np.float64).sum()) for block in _blocks(phi))
    return lambda_scale * total / phi.shape[1]


def gram(phi: np.ndarray) -> np.ndarray:
    """Phi^T Phi in float64: each block's product in Phi's precision, the blocks summed in float64.
    Rows of zeros (rollouts with no gradient) add nothing and are skipped."""
    k = phi.shape[1]
    out = np.zeros((k, k))
    for block in _blocks(phi):
        block = block[np.any(block != 0, axis=1)]
        out += (block.T @ block).astype(np.float64)
    return out


def resolve_form(form: str, n: int, k: int) -> str:
    if form == "auto":
        return "primal" if k <= n else "dual"
    if form not in ("primal", "dual"):
        raise ValueError(f"trak form {form!r} is not one of auto, primal, dual")
    return form


def factor(phi: np.ndarray, lam: float, form: str) -> dict[str, np.ndarray]:
    """What the scores need besides the targets: the form, lambda, and (Phi^T Phi + lam I)^-1 (primal) or
    the kernel Phi Phi^T (dual). The primal inverse is formed once, so each target kind and draw costs
    one product instead of a k x k solve."""
    form = resolve_form(form, *phi.shape)
    if form == "primal":
        g = gram(phi)
        return {"form": np.array(form), "lam": np.array(lam), "inverse": np.linalg.inv(g + lam * np.eye(len(g)))}
    return {"form": np.array(form), "lam": np.array(lam), "kernel": (phi @ phi.T).astype(np.float64)}


def solve_scores(phi: np.ndarray, targets: np.ndarray, idx: np.ndarray, prepared: dict) -> np.ndarray:
    """[n] values targets[idx[i]]^T (Phi^T Phi + lam I)^-1 phi_i, for a few target vectors targets [C, k].

    Products with Phi run in its own precision (float32 sketches: fast), the rest in float64.
    """
    lam = float(prepared["lam"])
    rows = np.arange(phi.shape[0])
    if str(prepared["form"]) == "primal":
        weights = prepared["inverse"] @ targets.astype(np.float64).T  # [k, C]; the inverse is symmetric
        return (phi @ weights.astype(phi.dtype))[rows, idx].astype(np.float64)
    # (Phi^T Phi + lam I)^-1 = (I - Phi^T (K + lam I)^-1 Phi) / lam, with K = Phi Phi^T
    kernel = prepared["kernel"]
    cross = (phi @ targets.T.astype(phi.dtype)).astype(np.float64)  # [n, C]
    solved = np.linalg.solve(kernel + lam * np.eye(len(kernel)), cross)
    return (cross[rows, idx] - (kernel @ solved)[rows, idx]) / lam


def raw_scores(phi: np.ndarray, targets: np.ndarray, idx: np.ndarray, lam: float, form: str) -> np.ndarray:
    """`solve_scores` with the factorization computed here."""
    return solve_scores(phi, targets, idx, factor(phi, lam, form))


def prepare(view, lambda_scale: float = 0.1, form: str = "auto") -> dict[str, np.ndarray]:
    phi = view.sketches
    return factor(phi, ridge(phi, lambda_scale), form)


def score(view, target, lambda_scale: float = 0.1, form: str = "auto", prepared=None):
    prepared = prepare(view, lambda_scale, form) if prepared is None else prepared
    idx, has = target.for_rows(view)
    values = solve_scores(view.sketches, target.vectors, idx, prepared)
    return np.where(has, -values, 0.0)


def step_score(view, target, lambda_scale: float = 0.1, form: str = "auto", prepared=None):
    """The step's summed feature against the target: by linearity, the sum of its rollouts' scores."""
    scores = score(view, target, lambda_scale, form, prepared)
    sums, _ = step_sums(view, scores[:, None])
    return sums[:, 0]
