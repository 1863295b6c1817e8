//! Timings behind the design of the fused kernels' inner loops (`transformer_kernels`'s
//! sub-layers and bf16 products): printed measurements, no assertions.
//!
//! ```text
//! RAYON_NUM_THREADS=1 cargo run --release -p transformer-kernels --example kernels_timing [NAME...]
//! ```
//! NAME is one or more of `projections` (the query, key and value projections merged into
//! one product or not), `attention` (the per-head products), `dropout` (drawing and applying
//! masks), `layer-bf16` (a layer's products in f32 and bf16), `lm-loss-bf16` (bf16 GFLOP/s at
//! the language-model loss's block shapes), `small-rows` (the few-row products with `W` read
//! in place against gemm's), `panels` (a beam step's output layer through gemm and through
//! `W` packed once into panels); without one, all of them. The bf16 timings print
//! nothing on a CPU without AMX or AVX512-BF16.

use transformer_kernels::timing;

const ALL: [(&str, fn()); 7] = [
    ("projections", timing::projections_merged_or_not),
    ("attention", timing::attention_heads),
    ("dropout", timing::dropout_masks),
    ("layer-bf16", timing::layer_products_bf16),
    ("lm-loss-bf16", timing::bf16_shapes_of_the_lm_loss),
    ("small-rows", timing::small_rows_or_gemm),
    ("panels", timing::panels_or_linear_wt),
];

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    for name in &names {
        if !ALL.iter().any(|(n, _)| n == name) {
            let known: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
            eprintln!("unknown timing {name:?}; choose from {}", known.join(", "));
            std::process::exit(2);
        }
    }
    for (name, run) in ALL {
        if names.is_empty() || names.iter().any(|n| n == name) {
            println!("== {name}");
            run();
        }
    }
}
