"""MXFP4 as the published K3 stores its routed experts (k3-checkpoint.md §2.6): per row, one E8M0 scale byte per 32
consecutive input elements, E2M1 codes two per byte with the even element in the low nibble.

The quantizer picks, per group, the better (lower squared error) of two scales: the smallest power of two that
holds the group's largest magnitude within E2M1's 6 (k3c's own k3c_mxfp4_quant_row rule) and half of it (the
largest element then saturates at 6, the rest get one more bit). Elements round to the nearest E2M1 value, ties to
the even code, as k3c's quantizer does. The engine only dequantizes, so any valid codes load; this rule is what
the export and the quantization-aware fine-tune share.
"""
import torch

GROUP = 32
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MID = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _magnitude_codes(v):
    mid = torch.tensor(_MID, dtype=v.dtype, device=v.device)
    c = torch.searchsorted(mid, v.contiguous(), right=False)  # number of midpoints < v
    tie = (c < 7) & (v == mid[c.clamp(max=6)]) & (c % 2 == 1)
    return c + tie.to(c.dtype)


def _smallest_exponent(amax):
    m, ex = torch.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1)
    e = torch.where(m <= 0.75, ex - 3, ex - 2)
    return torch.where(amax > 0, e, torch.full_like(e, -127))


def quantize(w):
    """w [..., K] float -> (codes uint8 [..., K] with the sign in bit 3, exponents int [..., K/32])."""
    K = w.shape[-1]
    assert K % GROUP == 0, K
    g = w.float().reshape(*w.shape[:-1], K // GROUP, GROUP)
    a = g.abs()
    e0 = _smallest_exponent(a.amax(-1)).clamp(-127, 127)
    table = torch.tensor(E2M1, dtype=torch.float32, device=w.device)
    best_codes, best_e, best_err = None, None, None
    for e in (e0, (e0 - 1).clamp(min=-127)):
        scale = torch.exp2(e.float()).unsqueeze(-1)
        codes = _magnitude_codes(a / scale)
        err = ((table[codes] * scale - a) ** 2).sum(-1)
        if best_err is None:
            best_codes, best_e, best_err = codes, e, err
        else:
            better = err < best_err
            best_codes = torch.where(better.unsqueeze(-1), codes, best_codes)
            best_e = torch.where(better, e, best_e)
            best_err = torch.where(better, err, best_err)
    sign = (torch.signbit(g)).to(torch.uint8) << 3
    codes = (best_codes.to(torch.uint8) | sign).reshape(w.shape)
    return codes, best_e


def dequantize(codes, e):
    table = torch.tensor(E2M1 + tuple(-x for x in E2M1), dtype=torch.float32, device=codes.device)
    K = codes.shape[-1]
    v = table[codes.long()].reshape(*codes.shape[:-1], K // GROUP, GROUP)
    return (v * torch.exp2(e.float()).unsqueeze(-1)).reshape(codes.shape)


def fake_quant(w):
    """The MXFP4 value of w, with a straight-through gradient (QAT)."""
    with torch.no_grad():
        q = dequantize(*quantize(w.detach())).to(w.dtype)
    return w + (q - w).detach()


def pack(codes, e):
    """(weight_packed uint8 [..., K/2], weight_scale uint8 [..., K/32]) as the checkpoint stores them."""
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    return (lo | (hi << 4)).to(torch.uint8), (e + 127).to(torch.uint8)


def unpack(packed, scale):
    codes = torch.stack([packed & 15, packed >> 4], -1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return dequantize(codes, scale.long() - 127)
