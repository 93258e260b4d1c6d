"""Adam in NumPy: what torch.optim.Adam and optax.adam keep and do, with nothing hidden.

For every parameter p with gradient g, at step t = 1, 2, ...:

    m = b1 m + (1 - b1) g            first moment: a running mean of the gradient
    v = b2 v + (1 - b2) g^2          second moment: a running mean of its square
    m_hat = m / (1 - b1^t)           bias correction: m and v start at 0, so early
    v_hat = v / (1 - b2^t)           averages are too small by exactly these factors
    p = p - lr * m_hat / (sqrt(v_hat) + eps)    eps outside the square root

This is PyTorch's formula (torch.optim.Adam, every implementation: for-loop, foreach, fused)
and optax.adam's (scale_by_adam with eps_root=0, then scale by -lr). The state is what
shared.adam_state exchanges: exp_avg (m), exp_avg_sq (v) and the step count t.
The frameworks update in place too (torch: param.addcdiv_; optax returns new arrays);
here every array is updated in place with out= so a step allocates nothing new.
"""

from __future__ import annotations

import numpy as np


def adam_update(
    param: np.ndarray,
    grad: np.ndarray,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    scratch: np.ndarray | None = None,
) -> None:
    """One Adam update of one parameter, in place: param, exp_avg, exp_avg_sq [any shape, one dtype].

    step: the step count t after this update (1 on the first). scratch: an optional array of
    the parameter's shape and dtype to compute in (else one is allocated).
    """
    b1, b2 = betas
    bias_correction1 = 1 - b1**step  # Python floats, in float64 like torch's and optax's scalars
    bias_correction2 = 1 - b2**step
    work = np.empty_like(param) if scratch is None else scratch

    # m = b1 m + (1 - b1) g
    exp_avg *= b1
    np.multiply(grad, 1 - b1, out=work)
    exp_avg += work
    # v = b2 v + (1 - b2) g^2
    exp_avg_sq *= b2
    np.multiply(grad, grad, out=work)
    work *= 1 - b2
    exp_avg_sq += work
    # p -= lr * m_hat / (sqrt(v_hat) + eps)
    np.divide(exp_avg_sq, bias_correction2, out=work)  # v_hat
    np.sqrt(work, out=work)
    work += eps
    np.divide(exp_avg, work, out=work)  # m / (sqrt(v_hat) + eps)
    work *= lr / bias_correction1  # lr * m_hat / (...)
    param -= work


class Adam:
    """Adam over a dict of NumPy parameters (the exchange dict), updated in place by step(grads).

    state: exp_avg and exp_avg_sq, dicts of arrays shaped like the parameters; step, the
    number of updates taken (as torch's optimizer.state[p]["step"] and optax's count).
    """

    def __init__(self, params: dict, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = params
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.step_count = 0
        self.exp_avg = {name: np.zeros_like(value) for name, value in params.items()}
        self.exp_avg_sq = {name: np.zeros_like(value) for name, value in params.items()}
        self._scratch = {name: np.empty_like(value) for name, value in params.items()}

    def step(self, grads: dict) -> None:
        """Update every parameter from its gradient (grads: the same names as params)."""
        self.step_count += 1
        for name, param in self.params.items():
            adam_update(
                param,
                grads[name],
                self.exp_avg[name],
                self.exp_avg_sq[name],
                self.step_count,
                self.lr,
                self.betas,
                self.eps,
                scratch=self._scratch[name],
            )
