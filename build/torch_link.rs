// Shared by the build scripts of every package that links libtorch (included with `include!`).
//
// Why: the linker drops `libtorch.so` as "not needed" (tch only references libtorch_cpu
// symbols directly), and with it `libtorch_cuda.so`, so CUDA would never be found at run
// time. `--no-as-needed -ltorch` keeps it. The rpath makes the binaries run with no
// LD_LIBRARY_PATH set.

fn torch_lib_dir() -> Option<std::path::PathBuf> {
    if let Ok(dir) = std::env::var("LIBTORCH") {
        let root = std::path::PathBuf::from(dir);
        // Resolve the venv symlink so the rpath names the real directory.
        let root = root.canonicalize().unwrap_or(root);
        check_torch_version(&root);
        return Some(root.join("lib"));
    }
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!dir.is_empty()).then(|| std::path::PathBuf::from(dir))
}

/// tch 0.24 is built against PyTorch 2.11.0 exactly; the pip wheel has no `build-version`
/// file for torch-sys to check, so check `version.py` here and fail with a clear message.
fn check_torch_version(root: &std::path::Path) {
    let Ok(text) = std::fs::read_to_string(root.join("version.py")) else {
        return;
    };
    if let Some(line) = text.lines().find(|l| l.starts_with("__version__")) {
        if !line.contains("'2.11.0") && !line.contains("\"2.11.0") {
            panic!(
                "{}: tch 0.24 needs PyTorch 2.11.0, found {line}; run `make clean-venv build`",
                root.display()
            );
        }
    }
}

fn link_torch() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PYTHON_SYS_EXECUTABLE");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    match torch_lib_dir() {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
            println!("cargo:rustc-link-arg=-ltorch");
            println!("cargo:rustc-link-arg=-Wl,--as-needed");
        }
        None => println!(
            "cargo:warning=torch not found: run `make build` (it installs torch 2.11.0 into .venv)"
        ),
    }
}
