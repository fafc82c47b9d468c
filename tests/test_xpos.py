"""xPos against independent references: the paper's complex form (Eq. 8/12) and TorchScale's XPOS.

Tolerance: the scaled vectors grow as zeta^(-n/B), so no fp32 implementation (TorchScale's included) is
within 1e-5 in absolute terms at long lengths (shared/notes/xpos-precision.md). Bounds are relative to
the magnitude: max|ours - reference| / max|reference|. Ours forms angles and powers in float64 and is
within 1e-6 of the float64 reference; TorchScale's fp32 keys are off by up to 1.7e-4 (d=128, L=4096),
so agreement with TorchScale is asserted up to TorchScale's own distance from the exact values.
"""

import math

import pytest
import torch
from torchscale.component.xpos_relative_position import XPOS as TorchScaleXPOS

from conftest import heads64, xpos_pair
from lex_plugin.modules.positions import XPos

GAMMA, B = 0.4, 512


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def complex_reference(x: torch.Tensor, start: int, center: int, key: bool, d: int, gamma=GAMMA, base=B,
                      theta=None, zeta=None):
    """Eq. 8/12 with complex numbers, float64: pair i of x at position n becomes
    (x_2i + i x_2i+1) * exp((+-xi_i + i theta_i) n), xi_i = ln(zeta_i) / B, with n measured from `center`
    for the scale (only n - m matters in the logit) and from 0 for the angle. theta / zeta default to
    the paper's (10000^(-2i/d), (2i/d + gamma)/(1 + gamma))."""
    i = torch.arange(d // 2, dtype=torch.float64)
    theta = 10000.0 ** (-2 * i / d) if theta is None else theta
    zeta = (2 * i / d + gamma) / (1 + gamma) if zeta is None else zeta
    xi = torch.log(zeta) / base
    n = torch.arange(start, start + x.size(-2), dtype=torch.float64)[:, None]
    z = torch.complex(x[..., 0::2].double(), x[..., 1::2].double())
    sign = -1.0 if key else 1.0
    rotated = z * torch.exp(torch.complex(sign * xi * (n - center), theta * n))
    return torch.stack((rotated.real, rotated.imag), dim=-1).flatten(-2)


def rotated_qkv64(attn, x: torch.Tensor, scheme):
    """A ``LexSelfAttention``'s q, k, v of x (B, T, C) in float64, (B, H, T, d) each, q and k rotated by ``scheme`` from
    the complex-number formula when it is an ``XPos`` (xPos: zeta^(+-n/B); RoPE, ``use_scale=False``: zeta = 1);
    unrotated otherwise (NoPE). The float64 references of the designs start here."""
    q, k, v = (heads64(x, proj, attn.num_heads) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if isinstance(scheme, XPos):
        gamma = 1e12 if not scheme.use_scale else GAMMA  # RoPE: zeta -> 1
        q = complex_reference(q, 0, 0, False, attn.head_dim, gamma=gamma)
        k = complex_reference(k, 0, 0, True, attn.head_dim, gamma=gamma)
    return q, k, v


def complex_logits(q, k, d):
    """Re(q~ conj(k~)) summed over pairs, q at 0..L-1 rotated by e^{(xi + i theta) n}, k by e^{(-xi + i theta) m}."""
    qr = complex_reference(q, 0, 0, False, d)
    kr = complex_reference(k, 0, 0, True, d)
    return qr @ kr.transpose(-1, -2)


@pytest.mark.parametrize("d,L", [(32, 256), (64, 1024), (128, 4096)])
def test_matches_complex_reference(d, L):
    torch.manual_seed(d)
    q, k = torch.randn(2, L, d), torch.randn(2, L, d)
    xpos = XPos(d, scale_base=B, gamma=GAMMA)
    # per tensor, with the same centre as the reference
    center = L // 2
    assert rel_err(xpos.rotate(q, center=center), complex_reference(q, 0, center, False, d)) <= 1e-6
    assert rel_err(xpos.rotate(k, center=center, keys=True), complex_reference(k, 0, center, True, d)) <= 1e-6
    # the logits (the quantity attention sees); the reference uses uncentred positions
    qx, kx = xpos_pair(xpos, q, k, q_start=0)
    ours = qx @ kx.transpose(-1, -2)
    assert rel_err(ours, complex_logits(q, k, d)) <= 2e-6


@pytest.mark.parametrize("d,L", [(32, 256), (64, 1024), (128, 4096)])
def test_matches_torchscale_xpos(d, L):
    torch.manual_seed(100 + d)
    q, k = torch.randn(4, L, d), torch.randn(4, L, d)
    ts = TorchScaleXPOS(d, scale_base=B)
    ours = XPos(d, scale_base=B, gamma=GAMMA)
    center = -((-L) // 2)  # TorchScale scales with positions -ceil(L/2) .. ; rotates with 0 .. L-1
    q_ts, k_ts = ts(q, offset=0, downscale=False), ts(k, offset=0, downscale=True)
    q_us, k_us = ours.rotate(q, center=center), ours.rotate(k, center=center, keys=True)
    assert rel_err(q_us, q_ts) <= 1e-5
    q_ex, k_ex = complex_reference(q, 0, center, False, d), complex_reference(k, 0, center, True, d)
    for us, ts_out, exact in ((k_us, k_ts, k_ex), (q_us @ k_us.transpose(-1, -2), q_ts @ k_ts.transpose(-1, -2), q_ex @ k_ex.transpose(-1, -2))):
        # within 1e-5, or within TorchScale's own fp32 error where that is larger
        assert rel_err(us, ts_out) <= max(1e-5, rel_err(ts_out, exact) + 1e-6)
    if L <= 256:  # at short lengths both are also close in absolute terms
        assert (q_us - q_ts).abs().max() <= 1e-4


def test_torchscale_incremental_offset_matches():
    """TorchScale's incremental query (offset = cached length) against ours at the same position."""
    d, L = 64, 300
    torch.manual_seed(0)
    q_last, k = torch.randn(2, 1, d), torch.randn(2, L, d)
    ts = TorchScaleXPOS(d, scale_base=B)
    ours = XPos(d, scale_base=B, gamma=GAMMA)
    ts_logit = ts(q_last, offset=L - 1) @ ts(k, downscale=True).transpose(-1, -2)
    qx, kx = xpos_pair(ours, q_last, k, q_start=L - 1)
    assert rel_err(qx @ kx.transpose(-1, -2), ts_logit) <= 1e-5


@pytest.mark.parametrize("shift", [1, 77, 5000])
def test_logits_depend_only_on_relative_position(shift):
    """Eq. 6: logits(m, n) == logits(m + k, n + k)."""
    d, L = 64, 128
    torch.manual_seed(shift)
    q, k = torch.randn(3, L, d), torch.randn(3, L, d)
    xpos = XPos(d)
    q0, k0 = xpos_pair(xpos, q, k, q_start=0, k_start=0)
    q1, k1 = xpos_pair(xpos, q, k, q_start=shift, k_start=shift)
    assert rel_err(q1 @ k1.transpose(-1, -2), q0 @ k0.transpose(-1, -2)) <= 1e-5
    # a query alone shifted by `shift` sees keys `shift` further back: same as the un-shifted diagonal band
    qs, ks = xpos_pair(xpos, q[:, :1], k[:, :1], q_start=shift, k_start=0)
    qt, kt = xpos_pair(xpos, q[:, :1], k[:, :1], q_start=shift + 10, k_start=10)
    assert rel_err(qs @ ks.transpose(-1, -2), qt @ kt.transpose(-1, -2)) <= 1e-5


def expectation_curve(d: int, n: torch.Tensor, zeta: torch.Tensor) -> torch.Tensor:
    """Eq. 10: g_zeta[n] = sum_i cos(n theta_i) zeta_i^(n / B), written independently of the module."""
    i = torch.arange(d // 2, dtype=torch.float64)
    theta = 10000.0 ** (-2 * i / d)
    return (torch.cos(n[:, None] * theta) * zeta ** (n[:, None] / B)).sum(-1)


def test_figure2_xpos_oscillates_far_less_than_rope():
    d = 64
    n = torch.arange(0, 8193, dtype=torch.float64)
    i = torch.arange(d // 2, dtype=torch.float64)
    zeta = (2 * i / d + GAMMA) / (1 + GAMMA)
    g_rope = expectation_curve(d, n, torch.ones_like(zeta))
    g_xpos = expectation_curve(d, n, zeta)
    assert g_rope[0] == g_xpos[0] == d // 2
    tail = slice(1024, None)  # long distances
    tv = lambda g: (g[tail][1:] - g[tail][:-1]).abs().sum().item()  # total variation
    assert tv(g_xpos) < 0.05 * tv(g_rope)
    assert g_xpos[tail].abs().max() < 0.6 * g_rope[tail].abs().max()
    # and the module's tables give the same curve: q = k = ones in each pair's real part
    xpos = XPos(d)
    m = 2048
    q = torch.zeros(1, d)
    q[:, 0::2] = 1.0
    qx, kx = xpos_pair(xpos, q.expand(1, d).unsqueeze(0), q.unsqueeze(0), q_start=m, k_start=0)
    assert math.isclose((qx @ kx.transpose(-1, -2)).item(), g_xpos[m].item(), rel_tol=1e-5, abs_tol=1e-5)


def test_rope_is_xpos_with_unit_zeta():
    d, L = 32, 64
    torch.manual_seed(3)
    q = torch.randn(1, L, d)
    rope = XPos(d, use_scale=False)
    ref = complex_reference(q, 0, 0, False, d, gamma=1e12)  # zeta -> 1
    assert rel_err(rope.rotate(q), ref) <= 1e-5


@pytest.mark.parametrize("ablation", ["scalar_zeta", "no_rotation"])
def test_table4_ablations_match_their_formulas(ablation):
    """LeX Table 4: one zeta = gamma/(1+gamma) for every pair; or theta = 0 (decay only)."""
    d, L = 64, 300
    torch.manual_seed(8)
    q = torch.randn(2, L, d)
    i = torch.arange(d // 2, dtype=torch.float64)
    if ablation == "scalar_zeta":
        xpos = XPos(d, scalar_zeta=True)
        ref = complex_reference(q, 0, L // 2, False, d, zeta=torch.full_like(i, GAMMA / (1 + GAMMA)))
    else:
        xpos = XPos(d, rotation=False)
        ref = complex_reference(q, 0, L // 2, False, d, theta=torch.zeros_like(i))
    assert rel_err(xpos.rotate(q, center=L // 2), ref) <= 1e-6
    assert rel_err(xpos.rotate(q, center=L // 2), XPos(d).rotate(q, center=L // 2)) > 1e-2  # it does change something


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_use_fp32_math(dtype):
    d, L = 64, 512
    torch.manual_seed(4)
    q, k = torch.randn(2, L, d), torch.randn(2, L, d)
    xpos = XPos(d)
    q32, k32 = xpos_pair(xpos, q, k, q_start=0)
    qh, kh = xpos_pair(xpos, q.to(dtype), k.to(dtype), q_start=0)
    assert qh.dtype == kh.dtype == dtype
    tol = 1e-3 if dtype == torch.float16 else 8e-3
    assert rel_err(qh.float(), q32) <= tol and rel_err(kh.float(), k32) <= tol
    # tables are fp32 whatever the input dtype
    assert xpos.complex_table(0, L, L // 2, False, q.device).dtype == torch.complex64  # fp32 cos + i sin


def test_tables_are_cached_and_not_state():
    xpos = XPos(64)
    a = xpos.complex_table(0, 100, 50, False, "cpu")
    b = xpos.complex_table(10, 90, 50, False, "cpu")  # a slice of the same cached table
    assert b.data_ptr() == a[10:].data_ptr() and torch.equal(b, a[10:])
    assert len(xpos.state_dict()) == 0 and len(list(xpos.buffers())) == 0


@pytest.mark.parametrize("bad", [0, 7, 33])
def test_odd_head_dim_is_rejected(bad):
    with pytest.raises(ValueError, match="even"):
        XPos(bad)


@pytest.mark.parametrize("kwargs,match", [(dict(gamma=0.0), "gamma"), (dict(scale_base=0), "scale base")])
def test_bad_xpos_parameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        XPos(64, **kwargs)


def test_tables_at_far_positions_stay_small():
    """A generation step at position 10^6 builds a table from there on, not 10^6 rows; values match a
    table built for that range alone."""
    xpos = XPos(64)
    row = xpos.complex_table(10**6, 1, 10**6, True, "cpu")
    assert row.shape == (1, 32)
    (low, table), = xpos._cache.values()
    assert low == 10**6 and table.size(0) <= 2 * 4096
    far = xpos.complex_table(10**6 + 5000, 1, 10**6, True, "cpu")
    ref = XPos(64).complex_table(10**6 + 5000, 1, 10**6, True, "cpu")
    assert torch.equal(far, ref)


@pytest.mark.parametrize("use_scale", [True, False], ids=["xpos", "rope"])
@pytest.mark.parametrize("scaling", [None, "yarn"])
def test_rotate_at_shortcuts_equal_the_general_path(use_scale, scaling):
    """rotate_at's two shortcuts (consecutive positions: the table sliced, no gather; every position 0 at centre 0:
    the identity, unless YaRN's attention scale multiplies) against the gathered rows and the float64 path."""
    from lex_plugin.modules.positions.rope_scaling import RopeScaling

    torch.manual_seed(0)
    scheme = XPos(16, scale_base=64) if use_scale else XPos(16, use_scale=False)
    s = None if scaling is None else RopeScaling(scaling, 4.0, 64)
    x = torch.randn(2, 3, 50, 16)
    p = torch.arange(100, 150)
    consecutive = scheme.rotate_at(x, p, center=128, keys=True, scaling=s)
    gathered = scheme.rotate_at(x.flip(-2), p.flip(0), center=128, keys=True, scaling=s).flip(-2)  # not consecutive: the gather
    torch.testing.assert_close(consecutive, gathered, rtol=0, atol=0)
    zero = torch.zeros(50, dtype=torch.long)
    expected = scheme.rotate_at(x, zero.double(), center=0, keys=True, scaling=s)  # float64 angles and scales
    torch.testing.assert_close(scheme.rotate_at(x, zero, center=0, keys=True, scaling=s), expected, rtol=0, atol=1e-6)
    assert (scheme.rotate_at(x, zero, center=0, keys=True, scaling=s) is x) == (scaling is None)


def test_far_apart_positions_keep_a_table_each(monkeypatch):
    """A position map's generation step rotates at n and at a remapped n / G, far apart: each range keeps its own
    table, so alternating between them builds two tables, not one per call (the sin / cos of TABLE_ROWS rows were
    60% of a Self-Extend step when they shared one); the rotations equal freshly built tables."""
    from lex_plugin.modules.positions.xpos import TABLE_ROWS, XPos

    scheme = XPos(16, use_scale=False)
    built = []
    real = scheme._build
    monkeypatch.setattr(scheme, "_build", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    x = torch.randn(1, 2, 1, 16)
    for step in range(6):
        for n in (4 * TABLE_ROWS + step, TABLE_ROWS // 2 + step // 8):
            got = scheme.rotate_at(x, torch.tensor([n]), center=0, keys=False)
            assert torch.allclose(got, XPos(16, use_scale=False).rotate_at(x, torch.tensor([n]), center=0, keys=False))
    assert len(built) == 2
