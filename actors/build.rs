include!("../build/torch_link.rs");

fn main() {
    link_torch();
    build_cuda_shim();
    build_dist_shim();
}

/// Compiles `csrc/dist_shim.cpp`: torch.distributed's Gloo process groups for the learner's
/// ranks. Gloo itself is inside libtorch_cpu; the headers c10d's `ProcessGroupGloo.hpp`
/// includes (absent from PyTorch's wheels) are vendored in `csrc/third_party`.
fn build_dist_shim() {
    println!("cargo:rerun-if-changed=csrc/dist_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/third_party");
    let Some(lib) = torch_lib_dir() else { return };
    let include = lib
        .parent()
        .map(|root| root.join("include"))
        .unwrap_or_default();
    cc::Build::new()
        .cpp(true)
        .file("csrc/dist_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("csrc/third_party")
        .define("USE_C10D_GLOO", None)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        .compile("agent_r1_dist_shim");
}

/// Compiles `csrc/cuda_shim.cpp` and sets `cfg(agent_r1_cuda)` where libtorch was built with
/// CUDA and the CUDA runtime headers it includes are there (the pip wheels
/// nvidia-cuda-runtime, -crt and -cccl beside torch, or a CUDA toolkit); elsewhere the engine
/// runs without CUDA graphs and says so when it starts on a GPU.
fn build_cuda_shim() {
    println!("cargo::rustc-check-cfg=cfg(agent_r1_cuda)");
    println!("cargo:rerun-if-changed=csrc/cuda_shim.cpp");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let Some(lib) = torch_lib_dir() else { return };
    let root = lib
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let include = root.join("include");
    let has_cuda_torch =
        lib.join("libtorch_cuda.so").is_file() && include.join("ATen/cuda/CUDAGraph.h").is_file();
    let site = root
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut candidates = vec![
        site.join("nvidia/cu13/include"),
        site.join("nvidia/cuda_runtime/include"),
    ];
    if let Ok(home) = std::env::var("CUDA_HOME") {
        candidates.push(std::path::PathBuf::from(home).join("include"));
    }
    candidates.push("/usr/local/cuda/include".into());
    let cuda = candidates.into_iter().find(|dir| {
        ["cuda_runtime_api.h", "crt/host_config.h", "nv/target"]
            .iter()
            .all(|f| dir.join(f).exists())
    });
    let (true, Some(cuda)) = (has_cuda_torch, cuda) else {
        println!(
            "cargo:warning=no CUDA graphs: libtorch without CUDA or no CUDA headers beside it"
        );
        return;
    };
    cc::Build::new()
        .cpp(true)
        .file("csrc/cuda_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(&cuda)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-interference-size")
        .warnings(false)
        .compile("agent_r1_cuda_shim");
    println!("cargo:rustc-link-lib=dylib=torch_cuda");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-cfg=agent_r1_cuda");
}
