//! Every input error is found before any launch and names the offending values (CPU only:
//! validation does not depend on the backend, so the emulator stands in for the device).

use flashattn::{Attention, BwdOptions, Entry, Error, FlashAttn, FwdOptions, FwdOutput, Window, validate};

fn err(q: &[usize], k: &[usize], v: &[usize], opts: Attention) -> Error {
    validate(q, k, v, &opts).expect_err("must be rejected")
}

#[test]
fn valid_shapes_pass() {
    let s = validate(&[2, 10, 8, 64], &[2, 20, 2, 64], &[2, 20, 2, 64], &Attention::default()).expect("valid");
    assert_eq!((s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim), (2, 10, 20, 8, 2, 64));
}

#[test]
fn wrong_rank() {
    let e = err(&[2, 10, 64], &[2, 10, 1, 64], &[2, 10, 1, 64], Attention::default());
    assert!(matches!(&e, Error::Rank { tensor: "q", shape, expected: 4 } if shape == &vec![2, 10, 64]), "{e}");
    assert!(e.to_string().contains("[2, 10, 64]"));
}

#[test]
fn zero_sized_dimensions() {
    for (i, t) in [(0, "q"), (1, "k"), (2, "v")] {
        let mut shapes = [vec![1, 4, 2, 8], vec![1, 4, 2, 8], vec![1, 4, 2, 8]];
        shapes[i][1] = 0;
        let e = err(&shapes[0], &shapes[1], &shapes[2], Attention::default());
        assert!(matches!(&e, Error::EmptyDimension { tensor, .. } if *tensor == t), "{e}");
    }
}

#[test]
fn k_v_shape_mismatch() {
    let e = err(&[1, 4, 2, 8], &[1, 4, 2, 8], &[1, 5, 2, 8], Attention::default());
    assert!(matches!(&e, Error::KvShapeMismatch { k, v } if k[1] == 4 && v[1] == 5), "{e}");
}

#[test]
fn batch_and_head_dim_mismatch() {
    let e = err(&[2, 4, 2, 8], &[3, 4, 2, 8], &[3, 4, 2, 8], Attention::default());
    assert!(matches!(e, Error::ShapeMismatch { left: 2, right: 3, .. }), "{e}");
    let e = err(&[2, 4, 2, 16], &[2, 4, 2, 8], &[2, 4, 2, 8], Attention::default());
    assert!(matches!(e, Error::ShapeMismatch { left: 16, right: 8, .. }), "{e}");
    assert!(e.to_string().contains("16") && e.to_string().contains("8"));
}

#[test]
fn unsupported_head_dims() {
    for d in [257, 264, 512] {
        let e = err(&[1, 4, 1, d], &[1, 4, 1, d], &[1, 4, 1, d], Attention::default());
        assert!(matches!(e, Error::UnsupportedHeadDim { head_dim } if head_dim == d), "{e}");
        assert!(e.to_string().contains(&d.to_string()));
    }
    // head_dim 0 is an empty tensor, refused as such (naming its shape).
    let e = err(&[1, 4, 1, 0], &[1, 4, 1, 0], &[1, 4, 1, 0], Attention::default());
    assert!(matches!(&e, Error::EmptyDimension { tensor: "q", shape } if shape == &[1, 4, 1, 0]), "{e}");
    for d in 1..=256 {
        assert!(validate(&[1, 4, 1, d], &[1, 4, 1, d], &[1, 4, 1, d], &Attention::default()).is_ok(), "d={d}");
    }
}

#[test]
fn heads_not_divisible() {
    let e = err(&[1, 4, 6, 8], &[1, 4, 4, 8], &[1, 4, 4, 8], Attention::default());
    assert!(matches!(e, Error::HeadsNotDivisible { heads_q: 6, heads_kv: 4 }), "{e}");
    let e = err(&[1, 4, 2, 8], &[1, 4, 4, 8], &[1, 4, 4, 8], Attention::default());
    assert!(matches!(e, Error::HeadsNotDivisible { heads_q: 2, heads_kv: 4 }), "{e}");
}

#[test]
fn sizes_beyond_kernel_limits() {
    let big = flashattn::MAX_GRID_YZ + 1;
    let e = err(&[big, 1, 1, 8], &[big, 1, 1, 8], &[big, 1, 1, 8], Attention::default());
    assert!(matches!(e, Error::TooLarge { what: "batch", value, .. } if value == big), "{e}");
    let e = err(&[1, 1, big, 8], &[1, 1, 1, 8], &[1, 1, 1, 8], Attention::default());
    assert!(matches!(e, Error::TooLarge { what: "heads_q", .. }), "{e}");
    let s = flashattn::MAX_SEQLEN + 1;
    let e = err(&[1, s, 1, 8], &[1, 1, 1, 8], &[1, 1, 1, 8], Attention::default());
    assert!(matches!(e, Error::TooLarge { what: "seqlen_q", .. }), "{e}");
    let e = err(&[1, 1, 1, 8], &[1, s, 1, 8], &[1, s, 1, 8], Attention::default());
    assert!(matches!(e, Error::TooLarge { what: "seqlen_k", .. }), "{e}");
    // Element count that overflows the host's byte arithmetic.
    let e = err(&[60_000, 1 << 30, 60_000, 256], &[60_000, 1, 1, 256], &[60_000, 1, 1, 256], Attention::default());
    assert!(matches!(e, Error::TooLarge { what: "elements of q", .. }), "{e}");
}

#[test]
fn invalid_scale() {
    let max = flashattn::MAX_SCALE;
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, max * 1.0001, -max * 1.0001, f32::MAX] {
        let opts = Attention { softmax_scale: Some(scale), ..Default::default() };
        let e = err(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8], opts);
        assert!(matches!(e, Error::InvalidScale { scale: s, max: m } if s.to_bits() == scale.to_bits() && m == max), "{e}");
        assert!(e.to_string().contains(&format!("{scale}")) && e.to_string().contains(&format!("{max}")), "{e}");
    }
    for scale in [0.0, -0.0, 1e-45, -1e-45, f32::MIN_POSITIVE, 1.0, -1.0, max, -max] {
        let opts = Attention { softmax_scale: Some(scale), ..Default::default() };
        assert!(validate(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8], &opts).is_ok(), "scale {scale}");
    }
}

/// A softcap must be finite, from MIN_SOFTCAP to MAX_SOFTCAP: the error names the value and
/// the range; the limits themselves and ordinary values pass.
#[test]
fn invalid_softcap() {
    let (lo, hi) = (flashattn::MIN_SOFTCAP, flashattn::MAX_SOFTCAP);
    for softcap in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, -30.0, lo * 0.5, hi * 1.0001, f32::MAX, 1e-45] {
        let opts = Attention::default().with_softcap(softcap);
        let e = err(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8], opts);
        assert!(
            matches!(e, Error::InvalidSoftcap { softcap: s, min, max } if s.to_bits() == softcap.to_bits() && min == lo && max == hi),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("{softcap}")) && e.to_string().contains(&format!("{hi}")), "{e}");
    }
    for softcap in [lo, 1e-3, 1.0, 30.0, 50.0, hi] {
        let opts = Attention::default().with_softcap(softcap);
        assert!(validate(&[1, 4, 1, 8], &[1, 4, 1, 8], &[1, 4, 1, 8], &opts).is_ok(), "softcap {softcap}");
    }
}

#[test]
fn forward_rejects_before_launch_and_leaves_outputs_alone() {
    let fa = FlashAttn::emulator();
    let q = fa.upload(&vec![1.0f32; 4 * 6 * 8], &[1, 4, 6, 8]).unwrap();
    let k = fa.upload(&vec![1.0f32; 4 * 4 * 8], &[1, 4, 4, 8]).unwrap();
    let mut out = FwdOutput::from_buffers(fa.full(7.0f32, &[1, 4, 6, 8]).unwrap(), fa.full(7.0f32, &[1, 6, 4]).unwrap(), None);
    let e = fa.forward_into(&q, &k, &k, &Attention::default(), &FwdOptions::default(), &mut out).expect_err("6 % 4 != 0");
    assert!(matches!(e, Error::HeadsNotDivisible { heads_q: 6, heads_kv: 4 }));
    assert!(fa.download(out.o()).unwrap().iter().all(|&x| x == 7.0));
    assert!(fa.download(out.lse()).unwrap().iter().all(|&x| x == 7.0));
    assert!(out.attention().is_none(), "a rejected forward records nothing");
}

#[test]
fn output_shape_and_host_length() {
    let fa = FlashAttn::emulator();
    let q = fa.upload(&vec![1.0f32; 4 * 2 * 8], &[1, 4, 2, 8]).unwrap();
    let (attn, opts) = (Attention::default(), FwdOptions::default());
    let mut out = FwdOutput::from_buffers(fa.full(0.0f32, &[1, 4, 2, 16]).unwrap(), fa.full(0.0f32, &[1, 2, 4]).unwrap(), None);
    let e = fa.forward_into(&q, &q, &q, &attn, &opts, &mut out).expect_err("o shape");
    assert!(matches!(&e, Error::OutputShape { tensor: "o", got, .. } if got == &vec![1, 4, 2, 16]), "{e}");
    let mut out = FwdOutput::from_buffers(fa.full(0.0f32, &[1, 4, 2, 8]).unwrap(), fa.full(0.0f32, &[1, 4, 2]).unwrap(), None);
    let e = fa.forward_into(&q, &q, &q, &attn, &opts, &mut out).expect_err("lse shape");
    assert!(matches!(&e, Error::OutputShape { tensor: "lse", .. }), "{e}");
    let e = fa.upload(&[1.0f32; 3], &[1, 2, 2, 1]).expect_err("length");
    assert!(matches!(e, Error::HostLength { expected: 4, got: 3 }), "{e}");
}

#[test]
fn tensors_of_another_instance() {
    let (a, b) = (FlashAttn::emulator(), FlashAttn::emulator());
    let q = a.upload(&[1.0f32; 8], &[1, 1, 1, 8]).unwrap();
    let e = b.forward(&q, &q, &q, &Attention::default(), &FwdOptions::default()).expect_err("other instance");
    assert!(matches!(e, Error::WrongDevice { tensor: "q" }), "{e}");
}

#[test]
fn unknown_kernel_family() {
    let fa = FlashAttn::emulator();
    let q = fa.upload(&[1.0f32; 8], &[1, 1, 1, 8]).unwrap();
    let opts = FwdOptions { kernel: Some("nope"), ..Default::default() };
    let e = fa.forward(&q, &q, &q, &Attention::default(), &opts).expect_err("unknown kernel");
    assert!(matches!(&e, Error::UnknownKernel { name, .. } if name == "nope"), "{e}");
}

#[test]
fn no_driver_is_an_error_not_a_panic() {
    // On a machine with a GPU this opens it; without one it must return an error.
    match FlashAttn::cuda(0) {
        Ok(fa) => assert!(!fa.is_emulator()),
        Err(e) => assert!(matches!(e, Error::NoDriver | Error::NoDevice { .. }), "{e}"),
    }
    let e = FlashAttn::cuda(1_000).expect_err("no device 1000");
    assert!(matches!(e, Error::NoDriver | Error::NoDevice { .. }), "{e}");
}

#[test]
fn every_family_has_variants_and_every_variant_a_family() {
    use flashattn::kernels::registry::FWD_VARIANTS;
    for f in flashattn::FWD_FAMILIES {
        assert!(FWD_VARIANTS.iter().any(|v| v.family == f.family), "family {} has no variant", f.name);
        assert_eq!(flashattn::FwdFamily::from_name(f.name), Some(f.family), "{}: one descriptor per family", f.name);
        assert_eq!((f.family.desc().family, f.family.desc().name), (f.family, f.name), "{}: desc() is its descriptor", f.name);
    }
    for v in FWD_VARIANTS {
        assert!(v.head_dims().0 >= 1 && v.launch(v.head_dims().1).is_some(), "{} serves no head_dim", v.name);
    }
}

#[test]
fn registry_matches_tile_functions() {
    use flashattn::Arch;
    use flashattn::kernels::dtype::DType;
    use flashattn::kernels::tile::{mma_tile, simt_tile, wgmma_tile};
    for d in 1..=256u32 {
        for dtype in [DType::F16, DType::Bf16] {
            let opts = FwdOptions { kernel: Some("mma"), ..Default::default() };
            let v = flashattn::select_variant(dtype, d as usize, &opts, &[Arch::Sm80]).unwrap_or_else(|e| panic!("d={d}: {e}"));
            let t = mma_tile(d).expect("tile");
            assert!(v.serves(d) && t.head_dim >= d, "d={d}: {}", v.name);
            assert_eq!(
                {
                    let l = fl(v, d);
                    (l.0, l.2, l.1)
                },
                (t.br(), t.smem_bytes(), t.threads()),
                "d={d}: {}",
                v.name
            );
        }
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let opts = FwdOptions { kernel: Some("simt"), ..Default::default() };
            let v = flashattn::select_variant(dtype, d as usize, &opts, &[Arch::Sm80]).unwrap_or_else(|e| panic!("d={d}: {e}"));
            let t = simt_tile(d);
            assert_eq!(
                {
                    let l = fl(v, d);
                    (l.0, l.2, l.1)
                },
                (t.br(), t.smem_bytes(d), t.threads()),
                "d={d}: {}",
                v.name
            );
        }
        // Hopper: wgmma where its tile applies (16-bit, head_dim <= 256), else the mma tile;
        // without sm_90a, the mma tile.
        for dtype in [DType::F16, DType::Bf16] {
            let auto = |archs: &[Arch]| {
                flashattn::select_variant(dtype, d as usize, &FwdOptions::default(), archs).unwrap_or_else(|e| panic!("d={d}: {e}"))
            };
            let hopper = auto(&[Arch::Sm80, Arch::Sm90a]);
            match wgmma_tile(d) {
                Some(t) => {
                    assert_eq!((hopper.family.name(), hopper.arch()), ("wgmma", Arch::Sm90a), "d={d}");
                    assert!(hopper.serves(d) && t.head_dim >= d, "d={d}: {}", hopper.name);
                    assert_eq!(
                        {
                            let l = fl(hopper, d);
                            (l.0, l.2, l.1)
                        },
                        (t.br(), t.smem_bytes(), t.threads()),
                        "d={d}: {}",
                        hopper.name
                    );
                }
                None => assert_eq!(hopper.family.name(), "mma", "d={d}"),
            }
            assert_eq!(auto(&[Arch::Sm80]).family.name(), "mma", "d={d}");
        }
    }
}

/// The backward variants selected for an attention without masks' extras (no window,
/// softcap or sinks) at `head_dim`, on a device running `archs`.
fn plain_bwd(
    dtype: flashattn::kernels::dtype::DType,
    head_dim: usize,
    opts: &BwdOptions,
    archs: &[flashattn::Arch],
    saved: bool,
) -> flashattn::Result<Vec<&'static flashattn::kernels::registry::BwdVariant>> {
    flashattn::select_bwd_variants(dtype, head_dim, opts, archs, saved, Entry::Plain, &Attention::default())
}

/// The backward variants automatic selection takes for `attn` (f16, head_dim 64, no
/// residual) on a machine with sm_80 and sm_90a kernels.
fn auto_bwd(attn: &Attention) -> Vec<&'static flashattn::kernels::registry::BwdVariant> {
    let archs = [flashattn::Arch::Sm80, flashattn::Arch::Sm90a];
    let dtype = flashattn::kernels::dtype::DType::F16;
    flashattn::select_bwd_variants(dtype, 64, &BwdOptions::default(), &archs, false, attn.entry(false), attn).expect("automatic selection")
}

#[test]
fn backward_selection_and_registry_match_tile_functions() {
    use flashattn::Arch;
    use flashattn::kernels::dtype::DType;
    use flashattn::kernels::registry::BWD_VARIANTS;
    use flashattn::kernels::tile::{MmaBwdTile, WgmmaBwdTile, mma_bwd_tile, mma_bwd_tile_atomic, wgmma_bwd_tile};
    for f in flashattn::BWD_FAMILIES {
        assert_eq!(flashattn::BwdFamily::from_name(f.name), Some(f.family), "{}: one descriptor per family", f.name);
        assert_eq!((f.family.desc().family, f.family.desc().name), (f.family, f.name), "{}: desc() is its descriptor", f.name);
        // Every pass of the family has a variant at some head_dim and dtype.
        for &pass in f.passes.iter().flat_map(|p| p.iter()) {
            assert!(BWD_VARIANTS.iter().any(|v| v.family == f.family && v.pass == pass), "family {} has no {pass:?} variant", f.name);
        }
    }
    for v in BWD_VARIANTS {
        assert!(v.family.desc().passes.iter().any(|p| p.contains(&v.pass)), "{}: {:?} is not a pass of its family", v.name, v.pass);
        assert!(v.head_dims().0 >= 1 && v.launch(v.head_dims().1).is_some(), "{} serves no head_dim", v.name);
    }
    for d in 1..=256u32 {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            // The mma families take head dims that are multiples of 8 (`BwdFamilyDesc::aligned_only`).
            let tc = dtype != DType::F32 && d.is_multiple_of(8);
            let auto = plain_bwd(dtype, d as usize, &BwdOptions::default(), &[Arch::Sm80], false).unwrap_or_else(|e| panic!("d={d}: {e}"));
            let want = if tc { "mma" } else { "simt" };
            assert!(auto.iter().all(|v| v.family.name() == want && v.serves(d)), "d={d} {dtype:?}: {}", auto[0].name);
            let det = BwdOptions { deterministic: true, ..Default::default() };
            let auto_det = plain_bwd(dtype, d as usize, &det, &[Arch::Sm80], false).unwrap_or_else(|e| panic!("d={d}: {e}"));
            let want_det = if tc { "mma" } else { "simt" };
            assert!(auto_det.iter().all(|v| v.family.name() == want_det && v.serves(d)), "d={d} {dtype:?}: {}", auto_det[0].name);
            // Hopper: `prep` (m_i, 1 / l_i from the LSE, D~_i from O), the wgmma dQ kernel and
            // the dK/dV kernel, deterministic too.
            for opts in [BwdOptions::default(), det] {
                let hop = plain_bwd(dtype, d as usize, &opts, &[Arch::Sm80, Arch::Sm90a], false).unwrap_or_else(|e| panic!("d={d}: {e}"));
                let fams: Vec<_> = hop.iter().map(|v| (v.family.name(), v.pass.name(), v.arch())).collect();
                if let Some(t) = wgmma_bwd_tile(d)
                    && dtype != DType::F32
                {
                    assert_eq!(
                        fams,
                        [("wgmma", "prep", Arch::Sm90a), ("wgmma", "dq_saved", Arch::Sm90a), ("wgmma", "dkdv", Arch::Sm90a)],
                        "d={d} {dtype:?}"
                    );
                    assert!(t.head_dim >= d && hop.iter().all(|v| v.serves(d)));
                    assert_eq!(fl(hop[1], d), (WgmmaBwdTile::ROWS, t.threads(), t.dq_smem_bytes()));
                    assert_eq!(fl(hop[2], d), (WgmmaBwdTile::KEYS, t.threads(), t.dkdv_smem_bytes()));
                    // A variable-length batch's dK/dV entry may take its own tile (two
                    // warpgroups at d = 128), launched as that tile says.
                    let tv = t.dkdv_entry(flashattn::kernels::ENTRY_VARLEN);
                    let lv = hop[2].launch_entry(d, flashattn::Entry::Varlen).expect("a varlen launch");
                    assert_eq!((lv.rows, lv.threads, lv.smem_bytes), (WgmmaBwdTile::KEYS, tv.threads(), tv.dkdv_smem_bytes()), "d={d}");
                    assert_eq!(tv.threads(), if t.head_dim == 128 { 256 } else { t.threads() }, "d={d}");
                    // With the forward's O residual: D~_i from O + O_lo, then the same dQ and
                    // dK/dV kernels.
                    let hs = plain_bwd(dtype, d as usize, &opts, &[Arch::Sm80, Arch::Sm90a], true).unwrap_or_else(|e| panic!("d={d}: {e}"));
                    assert_eq!(
                        hs.iter().map(|v| (v.family.name(), v.pass.name())).collect::<Vec<_>>(),
                        [("wgmma", "prep_residual"), ("wgmma", "dq_saved"), ("wgmma", "dkdv")],
                        "d={d}"
                    );
                    assert!(
                        hs.iter().all(|v| v.serves(d) && v.arch() == Arch::Sm90a) && hs[1].name == hop[1].name && hs[2].name == hop[2].name
                    );
                } else {
                    assert_eq!(
                        hop.iter().map(|v| v.family).collect::<Vec<_>>(),
                        auto.iter().map(|v| v.family).collect::<Vec<_>>(),
                        "d={d} {dtype:?}"
                    );
                    let hs = plain_bwd(dtype, d as usize, &opts, &[Arch::Sm80, Arch::Sm90a], true).unwrap_or_else(|e| panic!("d={d}: {e}"));
                    assert_eq!(
                        hs.iter().map(|v| v.name).collect::<Vec<_>>(),
                        hop.iter().map(|v| v.name).collect::<Vec<_>>(),
                        "d={d} {dtype:?}"
                    );
                }
            }
            let simt = BwdOptions { kernel: Some("simt"), ..Default::default() };
            let s = plain_bwd(dtype, d as usize, &simt, &[Arch::Sm80, Arch::Sm90a], false).unwrap_or_else(|e| panic!("d={d}: {e}"));
            assert!(s.iter().all(|v| v.family.name() == "simt"), "d={d}");
            // A softcap: only families whose kernels apply one, for the launch's entry (named,
            // the others are refused): `wgmma` in its general entries, not its
            // variable-length ones (`BwdFamilyDesc::softcap_varlen`). A window with a softcap
            // is a general launch whichever entry the caller names.
            let hop = [Arch::Sm80, Arch::Sm90a];
            let cap = Attention::default().with_softcap(30.0);
            for entry in [Entry::Window, Entry::General, Entry::Varlen] {
                let capped = flashattn::select_bwd_variants(dtype, d as usize, &BwdOptions::default(), &hop, false, entry, &cap)
                    .unwrap_or_else(|e| panic!("d={d}: {e}"));
                assert!(capped.iter().all(|v| v.family.desc().softcap_in(entry)), "d={d} {entry:?}");
            }
            if dtype != DType::F32 {
                let wgmma = BwdOptions { kernel: Some("wgmma"), ..Default::default() };
                let vs = flashattn::select_bwd_variants(dtype, d as usize, &wgmma, &hop, false, Entry::Window, &cap)
                    .unwrap_or_else(|e| panic!("d={d}: wgmma takes a softcap: {e}"));
                // Its dQ and dK/dV passes run their general entries (`_general`).
                assert_eq!(vs.iter().filter(|v| v.general_name.is_some()).count(), 2, "d={d}");
            }
            for (name, entry) in [("wgmma", Entry::Varlen), ("mma_atomic", Entry::General)] {
                let named = BwdOptions { kernel: Some(name), ..Default::default() };
                if dtype != DType::F32 && d % 8 == 0 {
                    let e = flashattn::select_bwd_variants(dtype, d as usize, &named, &hop, false, entry, &cap).expect_err("refused");
                    // (A family with no kernel at this head_dim says that first: `NoVariant`.)
                    let serves = BWD_VARIANTS.iter().any(|v| v.family.name() == name && v.dtype == dtype && v.serves(d));
                    match serves {
                        true => assert!(matches!(&e, Error::Unsupported { value, .. } if value == name), "d={d}: {e}"),
                        false => assert!(matches!(&e, Error::NoVariant { .. }), "d={d}: {e}"),
                    }
                }
            }
            // (Head dims that are not multiples of 8 select SIMT: `BwdFamilyDesc::aligned_only`.)
            if let Some(t) = mma_bwd_tile(d)
                && tc
            {
                assert!(t.head_dim >= d);
                let [dq, kv] = [auto_det[0], auto_det[1]];
                assert_eq!(
                    {
                        let l = fl(dq, d);
                        (dq.pass.name(), l.0, l.1, l.2)
                    },
                    ("dq", MmaBwdTile::ROWS, t.threads(), t.dq_smem_bytes())
                );
                assert_eq!(
                    {
                        let l = fl(kv, d);
                        (kv.pass.name(), l.0, l.1, l.2)
                    },
                    ("dkdv", MmaBwdTile::ROWS, t.threads(), t.dkdv_smem_bytes())
                );
                let atomic = BwdOptions { kernel: Some("mma_atomic"), ..Default::default() };
                let at = plain_bwd(dtype, d as usize, &atomic, &[Arch::Sm80, Arch::Sm90a], false);
                // The atomic family stops at 128.
                if d > 128 {
                    assert!(matches!(at, Err(flashattn::Error::NoVariant { .. })), "d={d}");
                    continue;
                }
                let at = at.unwrap_or_else(|e| panic!("d={d}: {e}"));
                let passes: Vec<_> = at.iter().map(|v| v.pass.name()).collect();
                assert_eq!(passes, ["stats", "dkdvq", "dq_convert"]);
                assert!(at.iter().all(|v| v.family.name() == "mma_atomic" && v.serves(d)));
                assert_eq!(
                    {
                        let l = fl(at[0], d);
                        (l.0, l.2)
                    },
                    (MmaBwdTile::ROWS, t.dq_smem_bytes())
                );
                let ta = mma_bwd_tile_atomic(d).expect("the atomic tile");
                assert_eq!(fl(at[1], d).0, MmaBwdTile::ROWS);
                assert_eq!(fl(at[1], d).2, ta.dkdvq_smem_bytes());
            }
        }
    }
    // Naming the atomic family with `deterministic` is a typed error, before any launch.
    let bad = BwdOptions { kernel: Some("mma_atomic"), deterministic: true };
    match flashattn::select_bwd_variants(DType::F16, 64, &bad, &[Arch::Sm80], false, Entry::Plain, &Attention::default()) {
        Err(flashattn::Error::NotDeterministic { family }) => assert_eq!(family, "mma_atomic"),
        other => panic!("expected NotDeterministic, got {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn backward_rejects_bad_shapes_and_kernels_before_launch() {
    let fa = FlashAttn::emulator();
    let q = fa.upload(&vec![1.0f32; 4 * 2 * 8], &[1, 4, 2, 8]).unwrap();
    let fwd = fa.forward(&q, &q, &q, &Attention::default(), &FwdOptions::default()).unwrap();
    let bwd = BwdOptions::default();
    let bad_do = fa.full(0.0f32, &[1, 4, 2, 16]).unwrap();
    let e = fa.backward(&q, &q, &q, &fwd, &bad_do, &bwd).expect_err("d_o shape");
    assert!(matches!(&e, Error::InputShape { tensor: "d_o", .. }), "{e}");
    let opts = BwdOptions { kernel: Some("nope"), ..Default::default() };
    let e = fa.backward(&q, &q, &q, &fwd, &q, &opts).expect_err("unknown family");
    assert!(
        matches!(&e, Error::UnknownKernel { name, available } if name == "nope" && *available == flashattn::BWD_FAMILIES.iter().map(|f| f.name).collect::<Vec<_>>()),
        "{e}"
    );
    // Forward family names are not backward ones.
    let opts = BwdOptions { kernel: Some("mma_br64"), ..Default::default() };
    let e = fa.backward(&q, &q, &q, &fwd, &q, &opts).expect_err("a forward-only family");
    assert!(matches!(&e, Error::UnknownKernel { name, .. } if name == "mma_br64"), "{e}");
    // The tensor-core backward has no f32 variant.
    let opts = BwdOptions { kernel: Some("mma"), ..Default::default() };
    let e = fa.backward(&q, &q, &q, &fwd, &q, &opts).expect_err("no f32 mma backward");
    assert!(matches!(&e, Error::NoVariant { .. }), "{e}");
    // The atomic family is not deterministic: a typed error when determinism is asked for.
    let q16 = fa.upload(&[half::f16::ONE; 4 * 2 * 8], &[1, 4, 2, 8]).unwrap();
    let fwd16 = fa.forward(&q16, &q16, &q16, &Attention::default(), &FwdOptions::default()).unwrap();
    let opts = BwdOptions { kernel: Some("mma_atomic"), deterministic: true };
    let e = fa.backward(&q16, &q16, &q16, &fwd16, &q16, &opts).expect_err("not deterministic");
    assert!(matches!(&e, Error::NotDeterministic { family } if family == "mma_atomic"), "{e}");
}

/// The backward computes the gradient of the forward's own attention on the forward's own
/// inputs: its options come from the forward's output, and other inputs are refused.
#[test]
fn backward_takes_the_forwards_attention_and_inputs() {
    let fa = FlashAttn::emulator();
    let data: Vec<half::f16> = flashattn::rng::Rng::new(3).tensor(4 * 2 * 8);
    let q = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let k = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let v = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let attn = Attention::causal().with_scale(-0.7);
    let fwd = fa.forward(&q, &k, &v, &attn, &FwdOptions::default()).unwrap();
    assert_eq!(fwd.attention(), Some(attn.clone()));
    let bwd = BwdOptions::default();
    assert!(fa.backward(&q, &k, &v, &fwd, &q, &bwd).is_ok());
    // Another tensor with the same contents is not the forward's input.
    let k2 = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let e = fa.backward(&q, &k2, &v, &fwd, &q, &bwd).expect_err("k is not the forward's");
    assert!(matches!(e, Error::NotForwardInput { tensor: "k" }), "{e}");
    let e = fa.backward(&v, &k, &q, &fwd, &q, &bwd).expect_err("q and v swapped");
    assert!(matches!(e, Error::NotForwardInput { tensor: "q" }), "{e}");
    // Buffers no forward wrote hold no attention.
    let blank = FwdOutput::from_buffers(fa.full(half::f16::ZERO, &[1, 4, 2, 8]).unwrap(), fa.full(0.0f32, &[1, 2, 4]).unwrap(), None);
    let e = fa.backward(&q, &k, &v, &blank, &q, &bwd).expect_err("no forward");
    assert!(matches!(e, Error::NoForward), "{e}");
    // A forward refused before it writes anything leaves the buffers, and their record, as
    // they were.
    let mut out = fa.forward(&q, &k, &v, &attn, &FwdOptions::default()).unwrap();
    let bad = FwdOptions { kernel: Some("nope"), ..Default::default() };
    assert!(fa.forward_into(&q, &k, &v, &Attention::default(), &bad, &mut out).is_err());
    assert_eq!(out.attention(), Some(attn.clone()));
    // Saving the residual needs a buffer for it when the kernel writes one.
    let mut out = FwdOutput::from_buffers(fa.full(half::f16::ZERO, &[1, 4, 2, 8]).unwrap(), fa.full(0.0f32, &[1, 2, 4]).unwrap(), None);
    let train = FwdOptions { save_residual: true, ..Default::default() };
    let e = fa.forward_into(&q, &k, &v, &attn, &train, &mut out).expect_err("no o_lo buffer");
    assert!(matches!(e, Error::MissingOutput { tensor: "o_lo", .. }), "{e}");
    let fwd = fa.forward(&q, &k, &v, &attn, &train).unwrap();
    assert!(fwd.o_lo().is_some(), "the emulator runs the Hopper forward, which writes the residual");
    // A later forward into the same buffers without the residual: the stale residual is not used.
    let mut fwd = fwd;
    fa.forward_into(&q, &k, &v, &attn, &FwdOptions::default(), &mut fwd).unwrap();
    assert!(fwd.o_lo().is_none());
}

/// Split-KV (`FwdOptions::splits`) that cannot run as asked is refused before any launch,
/// naming the count and why; 1 is no split.
#[test]
fn split_kv_refusals() {
    let fa = FlashAttn::emulator();
    let data: Vec<half::f16> = (0..64).map(|i| half::f16::from_f32(i as f32 / 64.0 - 0.5)).collect();
    let q = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let k = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let v = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let attn = Attention::default();
    let split = |kernel, splits, save_residual| FwdOptions { kernel, splits: Some(splits), save_residual, ..Default::default() };
    let cases = [
        (split(Some("wgmma"), 0, false), "at least 1"),
        (split(Some("mma"), 2, false), "does not split"),
        (split(Some("simt"), 3, false), "does not split"),
        (split(Some("wgmma"), 2, true), "save_residual"),
        (split(Some("wgmma"), 40_000, false), "grid"),
    ];
    for (opts, why) in cases {
        let mut out = fa.forward(&q, &k, &v, &attn, &FwdOptions::default()).unwrap();
        let before = fa.download(out.o()).unwrap();
        let e = fa.forward_into(&q, &k, &v, &attn, &opts, &mut out).expect_err("refused");
        match &e {
            Error::Splits { splits, why: w } => assert!(*splits == opts.splits.unwrap() && w.contains(why), "{e}"),
            _ => panic!("{opts:?}: {e}, not Error::Splits"),
        }
        assert_eq!(fa.download(out.o()).unwrap(), before, "a refused split changed O");
        assert_eq!(out.attention(), Some(attn.clone()));
    }
    for opts in [split(Some("wgmma"), 1, true), split(Some("mma"), 1, false), split(Some("wgmma"), 5, false)] {
        fa.forward(&q, &k, &v, &attn, &opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    }
}

/// A variant's launch at `head_dim`: (rows per block, threads, shared memory bytes).
fn fl<V: Launched>(v: &V, head_dim: u32) -> (u32, u32, u32) {
    let l = v.launch_at(head_dim).unwrap_or_else(|| panic!("no launch at head_dim {head_dim}"));
    (l.rows, l.threads, l.smem_bytes)
}

trait Launched {
    fn launch_at(&self, head_dim: u32) -> Option<flashattn::kernels::registry::Launch>;
}
impl Launched for flashattn::kernels::registry::FwdVariant {
    fn launch_at(&self, head_dim: u32) -> Option<flashattn::kernels::registry::Launch> {
        self.launch(head_dim)
    }
}
impl Launched for flashattn::kernels::registry::BwdVariant {
    fn launch_at(&self, head_dim: u32) -> Option<flashattn::kernels::registry::Launch> {
        self.launch(head_dim)
    }
}

/// Views (strided layouts over any memory) are checked before any launch: shape, strides,
/// the memory they reach, alignment, overlap of an output with another tensor, the backward's
/// workspace and the forward's own outputs. The view calls allocate nothing.
#[test]
fn views_are_checked_before_launch() {
    use flashattn::{AsView, BwdBuffers, BwdInputs, FwdBuffers};
    let fa = FlashAttn::emulator();
    let (b, s, h, d) = (1, 6, 2, 16);
    let n = b * s * h * d;
    let data: Vec<half::f16> = flashattn::rng::Rng::new(5).tensor(4 * n);
    let buf = fa.upload(&data, &[4 * n]).unwrap();
    let shape = [b, s, h, d];
    let qv = buf.view().reshaped(&shape, 0);
    let kv = buf.view().reshaped(&shape, n);
    let vv = buf.view().reshaped(&shape, 2 * n);
    let mut o = fa.full(half::f16::NAN, &[n + 8]).unwrap();
    let mut lse = fa.full(f32::NAN, &[b * h * s]).unwrap();
    let attn = Attention::causal();
    let fopts = FwdOptions::default();
    let fwd_err = |q: &flashattn::View<'_, half::f16>, o: flashattn::ViewMut<'_, half::f16>, lse: flashattn::ViewMut<'_, f32>| {
        fa.forward_into_views(q, &kv, &vv, &attn, &fopts, &mut FwdBuffers { o, lse, o_lo: None }).expect_err("must be refused")
    };
    // Rows one element off a 16-byte boundary (head_dim 16 in f16: 32-byte rows).
    let e = fwd_err(&buf.view().reshaped(&shape, 1), o.view_mut().reshaped(&shape, 0), lse.view_mut().reshaped(&[b, h, s], 0));
    assert!(matches!(e, Error::Misaligned { tensor: "q", align: 16, .. }), "{e}");
    // A row stride that is not a multiple of 8 elements.
    let q_odd = buf.view().strided(&shape, &[s * h * 20, h * 20, 20, 1], 0);
    let e = fwd_err(&q_odd, o.view_mut().reshaped(&shape, 0), lse.view_mut().reshaped(&[b, h, s], 0));
    assert!(matches!(e, Error::Misaligned { tensor: "q", value: 40, .. }), "{e}");
    // The last dimension not contiguous.
    let q_t = buf.view().strided(&shape, &[n, h * d, d, 2], 0);
    let e = fwd_err(&q_t, o.view_mut().reshaped(&shape, 0), lse.view_mut().reshaped(&[b, h, s], 0));
    assert!(matches!(&e, Error::Layout { tensor: "q", .. }), "{e}");
    // Past the end of the memory: O at offset 16 of n + 8 elements.
    let e = fwd_err(&qv, o.view_mut().reshaped(&shape, 16), lse.view_mut().reshaped(&[b, h, s], 0));
    assert!(matches!(e, Error::OutOfBounds { tensor: "o", needed, len } if needed == n + 16 && len == n + 8), "{e}");
    // Wrong shape of an output view.
    let e = fwd_err(&qv, o.view_mut().reshaped(&[b, s, h, d / 2], 0), lse.view_mut().reshaped(&[b, h, s], 0));
    assert!(matches!(e, Error::OutputShape { tensor: "o", .. }), "{e}");
    // A view of another instance's memory.
    let other = FlashAttn::emulator();
    let foreign = other.upload(&data[..n], &shape).unwrap();
    let e = fwd_err(&foreign.view(), o.view_mut().reshaped(&shape, 0), lse.view_mut().reshaped(&[b, h, s], 0));
    assert!(matches!(e, Error::WrongDevice { tensor: "q" }), "{e}");

    // A valid forward and backward on views: nothing allocated by the calls.
    let before = fa.device_allocations();
    let fwd = fa
        .forward_into_views(
            &qv,
            &kv,
            &vv,
            &attn,
            &fopts,
            &mut FwdBuffers { o: o.view_mut().reshaped(&shape, 8), lse: lse.view_mut().reshaped(&[b, h, s], 0), o_lo: None },
        )
        .unwrap();
    let bopts = BwdOptions::default();
    let need = fa.backward_workspace_len::<half::f16>(&fwd, &bopts).unwrap();
    let mut ws = fa.full(f32::NAN, &[need]).unwrap();
    let dov = buf.view().reshaped(&shape, 3 * n);
    macro_rules! ins {
        ($o:expr, $at:expr, $lse:expr) => {
            BwdInputs {
                q: buf.view().reshaped(&shape, 0),
                k: buf.view().reshaped(&shape, n),
                v: buf.view().reshaped(&shape, 2 * n),
                o: $o.view().reshaped(&shape, $at),
                lse: $lse.view().reshaped(&[b, h, s], 0),
                o_lo: None,
                d_o: dov.as_view(),
            }
        };
    }
    let (mut dq, mut dk, mut dv) =
        (fa.full(half::f16::NAN, &shape).unwrap(), fa.full(half::f16::NAN, &shape).unwrap(), fa.full(half::f16::NAN, &shape).unwrap());
    let mut run = |ins: &BwdInputs<'_, half::f16>, ws: &mut flashattn::Tensor<f32>| {
        let mut bufs = BwdBuffers { dq: dq.view_mut(), dk: dk.view_mut(), dv: dv.view_mut(), workspace: ws.view_mut(), dsinks: None };
        fa.backward_into_views(&fwd, ins, &mut bufs, &bopts)
    };
    let mut small = fa.full(f32::NAN, &[need - 1]).unwrap();
    let e = run(&ins!(o, 8, lse), &mut small).expect_err("workspace too small");
    assert!(matches!(e, Error::Workspace { needed, .. } if needed == need), "{e}");
    // O at another place than the forward wrote it.
    let e = run(&ins!(o, 0, lse), &mut ws).expect_err("not the forward's O");
    assert!(matches!(e, Error::NotForwardOutput { tensor: "o" }), "{e}");
    run(&ins!(o, 8, lse), &mut ws).expect("the forward's own views");
    // Allocated since `before`: this test's workspaces and gradients, nothing by the calls.
    assert_eq!(fa.device_allocations(), before + 5);
    for g in [&dq, &dk, &dv] {
        assert!(fa.download(g).unwrap().iter().all(|x| x.is_finite()), "every gradient element written");
    }
}

/// Sub-views' errors (`narrow`, `split_at`, `unbind` of `View` and `ViewMut`): typed, naming
/// the view's shape, the dimension and the values, before any call.
#[test]
fn sub_view_errors() {
    use flashattn::{View, ViewMut};
    let fa = FlashAttn::emulator();
    let mut t = fa.full(half::f16::ZERO, &[2, 4, 3, 2, 8]).unwrap();
    let sub = |e: Error| match e {
        Error::SubView { op, shape, dim, why } => (op, shape, dim, why),
        e => panic!("not a SubView error: {e}"),
    };
    // A dimension that is not there.
    let (op, shape, dim, why) = sub(t.view().narrow(5, 0, 1).unwrap_err());
    assert_eq!((op, shape, dim), ("narrow", vec![2, 4, 3, 2, 8], 5));
    assert!(why.contains("5 dimensions"), "{why}");
    assert_eq!(sub(t.view_mut().split_at(7, 0).unwrap_err()).0, "split_at");
    assert_eq!(sub(t.view_mut().unbind::<2>(9).unwrap_err()).2, 9);
    // Past the end of the dimension.
    let (_, _, dim, why) = sub(t.view_mut().narrow(2, 1, 3).unwrap_err());
    assert!(dim == 2 && why.contains("start 1 + length 3 is past its size 3"), "{why}");
    let (_, _, _, why) = sub(t.view().split_at(1, 5).unwrap_err());
    assert!(why.contains("mid 5 is past its size 4"), "{why}");
    // unbind: N must be the dimension's size, and the last dimension stays.
    let (op, _, dim, why) = sub(t.view_mut().unbind::<4>(2).unwrap_err());
    assert!(op == "unbind" && dim == 2 && why.contains("size is 3, not the 4"), "{why}");
    let (_, _, dim, why) = sub(t.view().unbind::<8>(4).unwrap_err());
    assert!(dim == 4 && why.contains("last dimension"), "{why}");
    // The message names the operation, the view and the values.
    let e = t.view_mut().reshaped(&[2, 4, 6, 8], 0).narrow(2, 4, 3).unwrap_err().to_string();
    assert_eq!(e, "narrow of dimension 2 of a view of shape [2, 4, 6, 8]: start 4 + length 3 is past its size 6");
    // Host views too.
    let mut host = vec![0u16; 24];
    assert!(matches!(ViewMut::host(&mut host, &[2, 3, 4]).unbind::<2>(2), Err(Error::SubView { dim: 2, .. })));
    assert!(matches!(View::host(&host, &[2, 3, 4]).unbind::<3>(0), Err(Error::SubView { op: "unbind", dim: 0, .. })));
}

/// Pieces of one buffer in one call: dQ, dK and dV written through `unbind` (MHA) or
/// `split_at` (GQA) pieces of one packed gradient buffer give the same bits as separate
/// gradient tensors; pieces that share an element are refused (`Overlap`) before any launch
/// and leave the buffer as it was; a piece read and another written in one call work.
#[test]
fn pieces_of_one_buffer_in_one_call() {
    use flashattn::{AsView, BwdBuffers, BwdInputs, FwdBuffers};
    use half::f16;
    let fa = FlashAttn::emulator();
    let (b, s, d) = (2, 9, 16);
    let attn = Attention::causal();
    let (fopts, bopts) = (FwdOptions::default(), BwdOptions::default());
    for (hq, hkv) in [(2, 2), (4, 2)] {
        let heads = hq + 2 * hkv;
        let data: Vec<f16> = flashattn::rng::Rng::new(11).tensor(b * s * heads * d);
        let d_o: Vec<f16> = flashattn::rng::Rng::new(12).tensor(b * s * hq * d);
        let qkv = fa.upload(&data, &[b, s, heads, d]).unwrap();
        let dot = fa.upload(&d_o, &[b, s, hq, d]).unwrap();
        let part = |start, len| qkv.view().narrow(2, start, len).unwrap();
        let (q, k, v) = (part(0, hq), part(hq, hkv), part(hq + hkv, hkv));
        let out = fa.forward(&q, &k, &v, &attn, &fopts).unwrap();
        let want = fa.backward(&q, &k, &v, &out, &dot, &bopts).unwrap();
        let want: Vec<Vec<f16>> = [&want.dq, &want.dk, &want.dv].iter().map(|t| fa.download(t).unwrap()).collect();

        let mut dqkv = fa.full(f16::NAN, &[b, s, heads, d]).unwrap();
        let rec = out.record().unwrap().clone();
        let inputs = || BwdInputs {
            q: q.as_view(),
            k: k.as_view(),
            v: v.as_view(),
            o: out.o().view(),
            lse: out.lse().view(),
            o_lo: None,
            d_o: dot.view(),
        };
        let mut ws = fa.full(f32::NAN, &[fa.backward_workspace_len::<f16>(&rec, &bopts).unwrap()]).unwrap();
        fn pieces(t: &mut flashattn::Tensor<f16>, hq: usize, hkv: usize) -> [flashattn::ViewMut<'_, f16>; 3] {
            let (dq, dkv) = t.view_mut().split_at(2, hq).unwrap();
            let (dk, dv) = dkv.split_at(2, hkv).unwrap();
            [dq, dk, dv]
        }
        // dK over dQ's elements, or one head on (over dQ's second head): shares elements.
        for shift in [0, d] {
            let [dq, dk, dv] = pieces(&mut dqkv, hq, hkv);
            let dk = dk.strided(&[b, s, hkv, d], dq.strides(), dq.offset() + shift);
            let mut bufs = BwdBuffers { dq, dk, dv, workspace: ws.view_mut(), dsinks: None };
            let e = fa.backward_into_views(&rec, &inputs(), &mut bufs, &bopts).expect_err("overlapping pieces");
            assert!(matches!(e, Error::Overlap { output: "dq", other: "dk" }), "{e}");
        }
        assert!(fa.download(&dqkv).unwrap().iter().all(|x| x.is_nan()), "nothing written by a refused call");
        // Disjoint pieces: one call, the same bits as separate tensors.
        let [dq, dk, dv] = match hq == hkv {
            true => dqkv.view_mut().reshaped(&[b, s, 3, hq, d], 0).unbind::<3>(2).unwrap(),
            false => pieces(&mut dqkv, hq, hkv),
        };
        let mut bufs = BwdBuffers { dq, dk, dv, workspace: ws.view_mut(), dsinks: None };
        fa.backward_into_views(&rec, &inputs(), &mut bufs, &bopts).unwrap();
        drop(bufs);
        let got = fa.download(&dqkv).unwrap();
        let piece = |start: usize, len: usize| -> Vec<f16> {
            (0..b * s).flat_map(|r| got[(r * heads + start) * d..(r * heads + start + len) * d].to_vec()).collect()
        };
        let got = [piece(0, hq), piece(hq, hkv), piece(hq + hkv, hkv)];
        for (name, g, w) in [("dq", &got[0], &want[0]), ("dk", &got[1], &want[1]), ("dv", &got[2], &want[2])] {
            assert!(g.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits()), "hq={hq} hkv={hkv}: {name} differs from separate tensors'");
        }
    }

    // A forward reading Q from one piece of a buffer and writing O into the other.
    let (hq, hkv) = (2, 2);
    let n = b * s * hq * d;
    let q: Vec<f16> = flashattn::rng::Rng::new(13).tensor(n);
    let kv: Vec<f16> = flashattn::rng::Rng::new(14).tensor(2 * n);
    let kv = fa.upload(&kv, &[b, s, 2, hkv, d]).unwrap();
    let [k, v] = kv.view().unbind::<2>(2).unwrap();
    let want = fa.forward(&fa.upload(&q, &[b, s, hq, d]).unwrap(), &k, &v, &attn, &fopts).unwrap();
    let mut both: Vec<f16> = q.clone();
    both.resize(2 * n, f16::NAN);
    let mut both = fa.upload(&both, &[2, b, s, hq, d]).unwrap();
    let mut lse = fa.full(f32::NAN, &[b, hq, s]).unwrap();
    let [qp, op] = both.view_mut().unbind::<2>(0).unwrap();
    let qp = qp.into_view();
    let mut bufs = FwdBuffers { o: op, lse: lse.view_mut(), o_lo: None };
    fa.forward_into_views(&qp, &k, &v, &attn, &fopts, &mut bufs).unwrap();
    drop(bufs);
    let got = fa.download(&both).unwrap();
    assert!(got[..n].iter().zip(&q).all(|(x, y)| x.to_bits() == y.to_bits()), "Q's piece untouched");
    let want_o = fa.download(want.o()).unwrap();
    assert!(got[n..].iter().zip(&want_o).all(|(x, y)| x.to_bits() == y.to_bits()), "O written into its piece");
    // O over Q's own piece: refused.
    let [qp, op] = both.view_mut().unbind::<2>(0).unwrap();
    let op = op.strided(qp.shape(), qp.strides(), qp.offset());
    let qp = qp.into_view();
    let mut bufs = FwdBuffers { o: op, lse: lse.view_mut(), o_lo: None };
    let e = fa.forward_into_views(&qp, &k, &v, &attn, &fopts, &mut bufs).expect_err("O over Q");
    assert!(matches!(e, Error::Overlap { output: "o", other: "q" }), "{e}");
}

/// A sliding window's backward runs where the family has windowed kernels (automatic
/// selection); named, an atomic family (none) is refused before launch, by name.
#[test]
fn window_backward_in_an_atomic_family_is_refused_before_launch() {
    let fa = FlashAttn::emulator();
    let data: Vec<half::f16> = (0..2 * 4 * 8).map(|i| half::f16::from_f32((i % 7) as f32 * 0.25)).collect();
    let x = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let attn = Attention::causal().with_window(Window::new(Some(2), None));
    let fwd = fa.forward(&x, &x, &x, &attn, &FwdOptions::default()).unwrap();
    for family in ["mma_atomic", "wgmma_atomic"] {
        let opts = BwdOptions { kernel: Some(family), ..Default::default() };
        let e = fa.backward(&x, &x, &x, &fwd, &x, &opts).expect_err(family);
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains(family), "{e}");
    }
    fa.backward(&x, &x, &x, &fwd, &x, &BwdOptions::default()).expect("automatic selection takes the window");
}

/// Attention sinks are checked before any launch: each logit finite or -inf, one per query
/// head; a backward of an attention with sinks needs a buffer for their gradient, and every
/// family takes them (`wgmma` named too).
#[test]
fn sinks_are_validated() {
    let fa = FlashAttn::emulator();
    for bad in [f32::NAN, f32::INFINITY] {
        match fa.sinks(&[0.0, bad]) {
            Err(Error::InvalidSink { head: 1, value }) => assert!(value.is_nan() || value == bad),
            other => panic!("sink {bad}: {other:?}"),
        }
    }
    assert!(matches!(fa.sinks(&[]), Err(Error::EmptyDimension { tensor: "sinks", .. })));
    let data: Vec<half::f16> = flashattn::rng::Rng::new(5).tensor(4 * 2 * 8);
    let q = fa.upload(&data, &[1, 4, 2, 8]).unwrap();
    let three = Attention::default().with_sinks(fa.sinks(&[0.0, 1.0, f32::NEG_INFINITY]).unwrap());
    match fa.forward(&q, &q, &q, &three, &FwdOptions::default()) {
        Err(Error::ShapeMismatch { left: 3, right: 2, .. }) => {}
        other => panic!("3 sinks for 2 heads: {other:?}"),
    }
    let attn = Attention::causal().with_sinks(fa.sinks(&[0.5, f32::NEG_INFINITY]).unwrap());
    let fwd = fa.forward(&q, &q, &q, &attn, &FwdOptions::default()).unwrap();
    let grads = fa.backward(&q, &q, &q, &fwd, &q, &BwdOptions::default()).unwrap();
    let ds = fa.download(grads.dsinks.as_ref().expect("dsinks returned")).unwrap();
    assert!(ds[0].is_finite() && ds[1] == 0.0, "a -inf sink has gradient 0: {ds:?}");
    let mut no_buffer = flashattn::BwdOutput {
        dq: fa.full(half::f16::NAN, &[1, 4, 2, 8]).unwrap(),
        dk: fa.full(half::f16::NAN, &[1, 4, 2, 8]).unwrap(),
        dv: fa.full(half::f16::NAN, &[1, 4, 2, 8]).unwrap(),
        dsinks: None,
    };
    let e = fa.backward_into(&q, &q, &q, &fwd, &q, &BwdOptions::default(), &mut no_buffer).expect_err("no dsinks buffer");
    assert!(matches!(e, Error::MissingOutput { tensor: "dsinks", .. }), "{e}");
    let wgmma = BwdOptions { kernel: Some("wgmma"), ..Default::default() };
    let named = fa.backward(&q, &q, &q, &fwd, &q, &wgmma).expect("wgmma takes sinks");
    let ds_named = fa.download(named.dsinks.as_ref().expect("dsinks returned by wgmma")).unwrap();
    assert!(ds_named[0].is_finite() && ds_named[1] == 0.0, "wgmma: a -inf sink has gradient 0: {ds_named:?}");
    assert!(auto_bwd(&attn).iter().all(|v| v.family.desc().sinks), "automatic selection takes a family with sinks");
}

/// ALiBi slopes: each finite (typed error naming the index and value), shaped `[heads_q]` or
/// `[batch, heads_q]` to match the call, and small enough for the call's sequences
/// (`MAX_ALIBI_BIAS`), all before any launch; the backward families without ALiBi refuse it
/// by name and automatic selection skips them.
#[test]
fn alibi_is_validated() {
    let fa = FlashAttn::emulator();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        match fa.alibi_slopes(&[0.5, bad], &[2]) {
            Err(Error::InvalidAlibiSlope { index: 1, slope, .. }) => assert!(slope.is_nan() || slope == bad),
            other => panic!("slope {bad}: {other:?}"),
        }
    }
    assert!(matches!(fa.alibi_slopes(&[], &[0]), Err(Error::EmptyDimension { tensor: "alibi_slopes", .. })));
    assert!(matches!(fa.alibi_slopes(&[0.5; 8], &[2, 2, 2]), Err(Error::Rank { tensor: "alibi_slopes", .. })));
    assert!(matches!(fa.alibi_slopes(&[0.5; 3], &[2]), Err(Error::HostLength { expected: 2, got: 3 })));
    let data: Vec<half::f16> = flashattn::rng::Rng::new(6).tensor(2 * 4 * 2 * 8);
    let q = fa.upload(&data, &[2, 4, 2, 8]).unwrap();
    let fwd_err = |a: flashattn::AlibiSlopes| fa.forward(&q, &q, &q, &Attention::default().with_alibi(a), &FwdOptions::default());
    match fwd_err(fa.alibi_slopes(&[0.5, 0.25, 0.125], &[3]).unwrap()) {
        Err(Error::ShapeMismatch { left: 3, right: 2, .. }) => {}
        other => panic!("3 slopes for 2 heads: {other:?}"),
    }
    match fwd_err(fa.alibi_slopes(&[0.5; 6], &[3, 2]).unwrap()) {
        Err(Error::ShapeMismatch { left: 3, right: 2, .. }) => {}
        other => panic!("slopes of 3 batch entries for 2: {other:?}"),
    }
    // |slope| (seqlen_q + seqlen_k) = 8 |slope| at most MAX_ALIBI_BIAS.
    let max = flashattn::MAX_ALIBI_BIAS / 8.0;
    match fwd_err(fa.alibi_slopes(&[0.5, -2.0 * max], &[2]).unwrap()) {
        Err(Error::InvalidAlibiSlope { index: 1, max: m, .. }) => assert_eq!(m, max),
        other => panic!("a slope past the bias limit: {other:?}"),
    }
    // Per batch entry, negative and zero slopes: accepted; the backward on the families with
    // ALiBi, refused by name on the others.
    let attn = Attention::causal().with_alibi(fa.alibi_slopes(&[0.5, 0.0, -0.25, max], &[2, 2]).unwrap());
    let fwd = fa.forward(&q, &q, &q, &attn, &FwdOptions::default()).unwrap();
    fa.backward(&q, &q, &q, &fwd, &q, &BwdOptions::default()).unwrap();
    fa.backward(&q, &q, &q, &fwd, &q, &BwdOptions { kernel: Some("wgmma"), ..Default::default() }).expect("wgmma takes ALiBi");
    for family in ["mma_atomic", "wgmma_atomic"] {
        let opts = BwdOptions { kernel: Some(family), ..Default::default() };
        let e = fa.backward(&q, &q, &q, &fwd, &q, &opts).expect_err("a family without ALiBi");
        assert!(matches!(e, Error::Unsupported { .. }), "{family}: {e}");
    }
    assert!(auto_bwd(&attn).iter().all(|v| v.family.desc().alibi), "automatic selection takes a family with ALiBi");
    // ALiBi with a softcap: `mma` refuses the pair by name, automatic selection takes a
    // family that applies both (`wgmma` on Hopper, else `simt`).
    let capped = attn.clone().with_softcap(5.0);
    let fwd = fa.forward(&q, &q, &q, &capped, &FwdOptions::default()).unwrap();
    let mma = BwdOptions { kernel: Some("mma"), ..Default::default() };
    let e = fa.backward(&q, &q, &q, &fwd, &q, &mma).expect_err("mma takes no ALiBi with a softcap");
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    fa.backward(&q, &q, &q, &fwd, &q, &BwdOptions::default()).unwrap();
    assert!(auto_bwd(&capped).iter().all(|v| v.family.desc().alibi_softcap), "automatic selection takes a family with ALiBi and a softcap");
}
