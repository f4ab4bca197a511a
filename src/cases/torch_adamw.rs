//! A float64 port of torch.optim.adamw's `_single_tensor_adamw` (torch 2.x, amsgrad
//! either way, capturable=False, differentiable=False), the reference the optimizer's tests and GPU
//! checks (`crate::checks::optim`) compare against. Written from torch's Python source, independently of the
//! kernel (which follows the fused CUDA kernel's algebra); the two agree to f32
//! rounding.

use crate::optim::ParamGroup;

/// One group's hyperparameters, as torch takes them (Python floats).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TorchHyper {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub maximize: bool,
    pub amsgrad: bool,
}

impl From<&ParamGroup> for TorchHyper {
    fn from(g: &ParamGroup) -> TorchHyper {
        TorchHyper {
            lr: g.lr,
            betas: g.betas,
            eps: g.eps,
            weight_decay: g.weight_decay,
            maximize: g.maximize,
            amsgrad: g.amsgrad,
        }
    }
}

/// One step for one parameter, in place: `step` is `state["step"]` after the increment
/// (1 on the first step). `max_exp_avg_sq` is `state["max_exp_avg_sq"]` (read and written
/// only when `h.amsgrad`; pass `&mut []` otherwise).
pub fn torch_adamw_step(
    param: &mut [f64],
    grad: &[f64],
    exp_avg: &mut [f64],
    exp_avg_sq: &mut [f64],
    max_exp_avg_sq: &mut [f64],
    h: &TorchHyper,
    step: u64,
) {
    let (beta1, beta2) = h.betas;
    // step_t += 1 (done by the caller); param.mul_(1 - lr * weight_decay)
    let decay = 1.0 - h.lr * h.weight_decay;
    let step = step as f64;
    let bias_correction1 = 1.0 - beta1.powf(step);
    let bias_correction2 = 1.0 - beta2.powf(step);
    let step_size = h.lr / bias_correction1;
    let bias_correction2_sqrt = bias_correction2.sqrt();
    for i in 0..param.len() {
        // grad = grad if not maximize else -grad
        let g = if h.maximize { -grad[i] } else { grad[i] };
        param[i] *= decay;
        // exp_avg.lerp_(grad, 1 - beta1)
        exp_avg[i] += (1.0 - beta1) * (g - exp_avg[i]);
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        exp_avg_sq[i] = exp_avg_sq[i] * beta2 + (1.0 - beta2) * g * g;
        let denom = if h.amsgrad {
            // torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            max_exp_avg_sq[i] = max_exp_avg_sq[i].max(exp_avg_sq[i]);
            // denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(eps)
            max_exp_avg_sq[i].sqrt() / bias_correction2_sqrt + h.eps
        } else {
            // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            exp_avg_sq[i].sqrt() / bias_correction2_sqrt + h.eps
        };
        // param.addcdiv_(exp_avg, denom, value=-step_size)
        param[i] += -step_size * exp_avg[i] / denom;
    }
}
