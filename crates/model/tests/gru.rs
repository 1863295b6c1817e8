//! The GRU against `torch.nn.GRU`, from the float64 fixtures of `scripts/make_gru_fixtures.py`:
//! outputs, final states and every gradient (parameters, input, initial state), in float64
//! (to ~1e-10) and float32 (to ~1e-5), with and without padding.

mod common;

use candle_core::{DType, Device, Result, Tensor};
use common::{assert_close, Fixture};
use transformer_model::gru::Gru;
use transformer_model::{Mode, ParamBuilder};

fn check(file: &str, use_h0: bool, use_lengths: bool) -> Result<()> {
    for dtype in [DType::F64, DType::F32] {
        let fx = Fixture::load(file, dtype);
        let pb = ParamBuilder::new(dtype, &Device::Cpu, 0);
        let gru = Gru::new(
            &pb,
            fx.meta_usize("input_size"),
            fx.meta_usize("hidden_size"),
            fx.meta_usize("num_layers"),
            fx.meta("bidirectional") == "true",
            0.0,
        )?;
        let params = pb.params();
        params.assign(&fx.group("param"))?;
        let x = fx.input("x");
        let h0 = fx.input("h0");
        let lengths: Vec<usize> = fx
            .t("input.lengths")
            .to_vec1::<i64>()?
            .into_iter()
            .map(|l| l as usize)
            .collect();
        let (out, h_n) = gru.forward(
            &x,
            use_lengths.then_some(lengths.as_slice()),
            use_h0.then_some(h0.as_tensor()),
            Mode::Eval,
        )?;
        assert_close(&format!("{file} out"), &out, &fx.t("output.out"), dtype);
        assert_close(&format!("{file} h_n"), &h_n, &fx.t("output.h_n"), dtype);
        let loss = ((&out * fx.t("cotangent.out"))?.sum_all()?
            + (&h_n * fx.t("cotangent.h_n"))?.sum_all()?)?;
        let grads = loss.backward()?;
        let want = fx.group("grad");
        assert_eq!(want.len(), params.len());
        for (name, var) in params.iter() {
            let g = grads.get(var.as_tensor()).expect("parameter gradient");
            assert_close(&format!("{file} grad {name}"), g, &want[name], dtype);
        }
        let gx = grads.get(x.as_tensor()).expect("input gradient");
        assert_close(&format!("{file} grad x"), gx, &fx.t("grad_input.x"), dtype);
        if use_h0 {
            let gh = grads.get(h0.as_tensor()).expect("h0 gradient");
            assert_close(
                &format!("{file} grad h0"),
                gh,
                &fx.t("grad_input.h0"),
                dtype,
            );
        }
    }
    Ok(())
}

#[test]
fn bidirectional_two_layers_over_a_padded_batch_match_packed_sequences() -> Result<()> {
    check("gru_bi2_packed.safetensors", true, true)
}

#[test]
fn one_layer_without_padding_matches_torch() -> Result<()> {
    check("gru_uni1.safetensors", false, false)
}

#[test]
fn padding_never_changes_a_rows_result() -> Result<()> {
    // A row run alone equals the same row inside a padded batch (outputs and final state).
    let dev = Device::Cpu;
    let pb = ParamBuilder::new(DType::F64, &dev, 3);
    let gru = Gru::new(&pb, 3, 4, 2, true, 0.0)?;
    let x = Tensor::randn(0f64, 1.0, (2, 5, 3), &dev)?;
    let (out, h) = gru.forward(&x, Some(&[5, 2]), None, Mode::Eval)?;
    let alone = x.narrow(0, 1, 1)?.narrow(1, 0, 2)?;
    let (out1, h1) = gru.forward(&alone, None, None, Mode::Eval)?;
    assert_close(
        "row 1 outputs",
        &out.narrow(0, 1, 1)?.narrow(1, 0, 2)?,
        &out1,
        DType::F64,
    );
    assert_close("row 1 final", &h.narrow(1, 1, 1)?, &h1, DType::F64);
    // Outputs at padded positions are zero.
    let pad = out.narrow(0, 1, 1)?.narrow(1, 2, 3)?.abs()?.sum_all()?;
    assert_eq!(pad.to_scalar::<f64>()?, 0.0);
    Ok(())
}
