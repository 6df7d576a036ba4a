"""TRAK-style score <phi_target, (Phi^T Phi + lambda I)^-1 phi_z>, Phi the sketches of all rollouts.

lambda = lambda_scale x the mean diagonal of Phi^T Phi (0.1 as in the paper). The primal form solves a
k x k system; the dual form, (Phi Phi^T + lambda I)^-1 Phi phi_target, an n x n one; `form: auto` takes
the smaller. Minus the value, as in tracincp: positive means the rollout's update raised the target.

The Cholesky factor of Phi^T Phi + lambda I (primal) or Phi Phi^T + lambda I (dual) depends on the seed's
sketches only, so `prepare` computes it once per seed and every target kind and draw reuses it.

With `use_clip` each row of Phi is the rollout's post-clip contribution (its sketch times its step's clip
coefficient), the update the optimizer applied; the step score, their sum, is then TRAK on the paper's post-clip
step sketches.
"""

import numpy as np

from behaviortrace.common.vectors import clip_coefficients, step_sums

USES_TARGET = True
STEP_AGGREGATE = "sum"
SOLVE_BLOCK = 512


def ridge(squares: np.ndarray, lambda_scale: float) -> float:
    """lambda_scale x the mean diagonal of Phi^T Phi, from the float64 column sums of squares. Where every sketch
    is zero (a run in which no rollout had a gradient) any ridge gives the same zero scores: 1."""
    mean = float(np.sum(squares, dtype=np.float64)) / len(squares)
    return lambda_scale * mean if mean > 0 else 1.0


def resolve_form(form: str, n: int, k: int) -> str:
    if form == "auto":
        return "primal" if k <= n else "dual"
    if form not in ("primal", "dual"):
        raise ValueError(f"trak form {form!r} is not one of auto, primal, dual")
    return form


SIDE = {"primal": "features", "dual": "rollouts"}


def factor(gram: np.ndarray, lam: float, form: str) -> dict[str, np.ndarray]:
    """What the scores need besides the targets: the form, lambda, and the Cholesky factor of
    Phi^T Phi + lam I (primal; `gram` is Phi^T Phi) or of Phi Phi^T + lam I (dual; `gram` is Phi Phi^T).
    It is formed once per seed, so each target kind and draw costs two triangular solves."""
    chol = np.linalg.cholesky(gram + lam * np.eye(len(gram)))
    return {"form": np.array(form), "lam": np.array(lam), "cholesky": chol}


def cholesky_solve(chol: np.ndarray, rhs: np.ndarray, block: int = SOLVE_BLOCK) -> np.ndarray:
    """(L L^T)^-1 rhs for lower-triangular L, by blocked forward and back substitution (numpy has no
    triangular solver; each diagonal block is small, so solving it as a general system costs little)."""
    n = len(chol)
    rhs = np.asarray(rhs, dtype=np.float64)
    y = np.empty_like(rhs)
    for a in range(0, n, block):
        b = min(a + block, n)
        y[a:b] = np.linalg.solve(chol[a:b, a:b], rhs[a:b] - chol[a:b, :a] @ y[:a])
    x = np.empty_like(y)
    for a in reversed(range(0, n, block)):
        b = min(a + block, n)
        x[a:b] = np.linalg.solve(chol[a:b, a:b].T, y[a:b] - chol[b:, a:b].T @ x[b:])
    return x


def solve_scores(phi: np.ndarray, targets: np.ndarray, idx: np.ndarray, prepared: dict) -> np.ndarray:
    """[n] values targets[idx[i]]^T (Phi^T Phi + lam I)^-1 phi_i, for a few target vectors targets [C, k].

    Dual form: (Phi^T Phi + lam I)^-1 Phi^T = Phi^T (Phi Phi^T + lam I)^-1, so the values are the rows of
    (Phi Phi^T + lam I)^-1 Phi targets^T. Products with Phi run in its own precision (float32 sketches:
    fast), the rest in float64.
    """
    rows = np.arange(phi.shape[0])
    if str(prepared["form"]) == "primal":
        weights = cholesky_solve(prepared["cholesky"], targets.astype(np.float64).T)  # [k, C]
        return (phi @ weights.astype(phi.dtype))[rows, idx].astype(np.float64)
    cross = (phi @ targets.T.astype(phi.dtype)).astype(np.float64)  # [n, C]
    return cholesky_solve(prepared["cholesky"], cross)[rows, idx]


def raw_scores(phi: np.ndarray, targets: np.ndarray, idx: np.ndarray, lam: float, form: str) -> np.ndarray:
    """`solve_scores` with the Gram matrix and its factorization computed here."""
    form = resolve_form(form, *phi.shape)
    phi64 = np.asarray(phi, dtype=np.float64)
    gram = phi64.T @ phi64 if form == "primal" else phi64 @ phi64.T
    return solve_scores(phi, targets, idx, factor(gram, lam, form))


def features(view, use_clip: bool) -> np.ndarray:
    """Phi: the sketches, or with `use_clip` each row times its step's clip coefficient."""
    if not use_clip:
        return view.sketches
    return view.sketches * clip_coefficients(view)[:, None].astype(view.sketches.dtype)


def prepare(view, lambda_scale: float = 0.1, form: str = "auto", use_clip: bool = False) -> dict[str, np.ndarray]:
    """Lambda and the factorization, from the seed's Gram matrix (which the workflow computes once per
    seed on the smaller side, so rerunning trak with `form: auto` only factors it; post-clip rows need their own)."""
    form = resolve_form(form, *view.sketches.shape)
    if not use_clip:
        return factor(view.gram(SIDE[form]), ridge(view.squares, lambda_scale), form)
    gram, squares = view.scaled_moments(clip_coefficients(view), SIDE[form])
    return factor(gram, ridge(squares, lambda_scale), form)


def score(view, target, lambda_scale: float = 0.1, form: str = "auto", use_clip: bool = False, prepared=None):
    prepared = prepare(view, lambda_scale, form, use_clip) if prepared is None else prepared
    idx, has = target.for_rows(view)
    values = solve_scores(features(view, use_clip), target.vectors, idx, prepared)
    return np.where(has, -values, 0.0)


def step_score(view, target, lambda_scale: float = 0.1, form: str = "auto", use_clip: bool = False, prepared=None):
    """The step's summed feature against the target: by linearity, the sum of its rollouts' scores."""
    scores = score(view, target, lambda_scale, form, use_clip, prepared)
    sums, _ = step_sums(view, scores[:, None])
    return sums[:, 0]
