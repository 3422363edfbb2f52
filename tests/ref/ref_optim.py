"""Reference cases for AdamW and the reductions (tests/kernels/test_optim.cpp).

optim_adamw.ref: torch.optim.AdamW (foreach=False, amsgrad=False) run in
float32 for 5 steps on one parameter with a fixed sequence of gradients.
Hyperparameters are float32-representable so that loom's float config is the
same number torch sees. loom is given the raw gradients grad_k with
grad_scale; torch is given grad_k * grad_scale computed in float32.
  param0, grad_1..grad_5, and after step k: param_k, exp_avg_k, exp_avg_sq_k;
  lr, beta1, beta2, eps, weight_decay, grad_scale (scalars)

optim_norms.ref: tensors t0..t3 (t3 bf16) and, in float64 from their exact
values, each sum of squares and the global norm (torch.linalg.vector_norm).
loomref stores float64 as float32, so each float64 x is saved as hi + lo
(hi = float32(x), lo = float32(x - hi)): about 48 bits survive.
"""
import os

import torch

import loomref


def f32(x):
    """The float32 nearest x, as a Python float."""
    return float(torch.tensor(x, dtype=torch.float32))


def adamw_case(out):
    n = 40009  # > 32768: loom's parallel path; not a multiple of 16 or 512: ragged chunks
    hp = {"lr": f32(1e-2), "beta1": f32(0.9), "beta2": f32(0.95), "eps": f32(1e-8), "weight_decay": f32(0.1),
          "grad_scale": f32(0.3)}
    param0 = torch.randn(n)
    # Gradients spanning 1e-6 .. 10, so both the eps-dominated and the v-dominated regimes occur.
    grads = [torch.randn(n) * 10.0 ** torch.empty(n).uniform_(-6, 1) for _ in range(5)]
    p = param0.clone().requires_grad_()
    opt = torch.optim.AdamW([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], amsgrad=False, foreach=False)
    saved = {"param0": param0}
    for k, g in enumerate(grads, start=1):
        p.grad = g * hp["grad_scale"]  # float32 tensor times a float32-exact scalar: a float32 multiply
        opt.step()
        st = opt.state[p]
        saved.update({f"grad_{k}": g, f"param_{k}": p.detach().clone(), f"exp_avg_{k}": st["exp_avg"].clone(),
                      f"exp_avg_sq_{k}": st["exp_avg_sq"].clone()})
    saved.update(hp)
    loomref.save(os.path.join(out, "optim_adamw.ref"), saved)


def hi_lo(x):
    x = torch.as_tensor(x, dtype=torch.float64)
    hi = x.float()
    return hi, (x - hi.double()).float()


def norms_case(out):
    tensors = [torch.randn(1), torch.randn(1000) * 3, torch.randn(100003),
               (torch.randn(5000) * 100).bfloat16()]
    saved = {}
    for i, t in enumerate(tensors):
        saved[f"t{i}"] = t
        saved[f"sumsq{i}_hi"], saved[f"sumsq{i}_lo"] = hi_lo((t.double() ** 2).sum())
    norm = torch.linalg.vector_norm(torch.cat([t.double().flatten() for t in tensors]))
    saved["norm_hi"], saved["norm_lo"] = hi_lo(norm)
    loomref.save(os.path.join(out, "optim_norms.ref"), saved)


def main():
    out = loomref.out_dir()
    torch.manual_seed(2024)
    adamw_case(out)
    norms_case(out)


if __name__ == "__main__":
    main()
