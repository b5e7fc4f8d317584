//! include/jaccl.h is what cbindgen makes of src/ now; and it compiles as C99 and C++11 with
//! every warning an error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header() -> PathBuf {
    crate_dir().join("include/jaccl.h")
}

#[test]
fn header_is_generated_from_the_source() {
    let config = cbindgen::Config::from_file(crate_dir().join("cbindgen.toml"))
        .expect("cbindgen.toml is valid");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir())
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    if std::env::var_os("JACCL_BLESS").is_some() {
        std::fs::write(header(), &generated).expect("include/jaccl.h is writable");
    }
    let committed = std::fs::read_to_string(header()).unwrap_or_default();
    assert!(
        committed == generated,
        "include/jaccl.h differs from what cbindgen makes of src/: run \
         `JACCL_BLESS=1 cargo test -p jaccl-c --test header` and commit it"
    );
}

/// Compiles a file that includes the header with `compiler` and `flags`.
fn compiles(compiler: &str, source: &Path, flags: &[&str]) {
    let out = std::env::temp_dir().join(format!(
        "jaccl-header-{}-{}.o",
        compiler,
        std::process::id()
    ));
    let status = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Wpedantic", "-Werror", "-c"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    let _ = std::fs::remove_file(&out);
    assert!(
        status.success(),
        "{compiler} {flags:?} compiles {}",
        source.display()
    );
}

#[test]
fn header_compiles_as_c99_and_cpp11() {
    let dir = std::env::temp_dir().join(format!("jaccl-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let c = dir.join("uses.c");
    let source = "#include <jaccl.h>\nint main(void) { jaccl_config_t c; jaccl_config_init(&c); return (int)sizeof(c) == 0; }\n";
    std::fs::write(&c, source).expect("writable");
    let cpp = dir.join("uses.cpp");
    std::fs::write(&cpp, source.replace("(void)", "()")).expect("writable");
    compiles("cc", &c, &["-std=c99"]);
    compiles("c++", &cpp, &["-std=c++11"]);
    let _ = std::fs::remove_dir_all(&dir);
}
