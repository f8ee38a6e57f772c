//! W14 files (BENCH.md): N items (`w14_items`), each making one file of 100 KiB, half of them
//! the same bytes and the other half distinct, stored into a fresh SQLite store.
//!
//! Variant `sink`: the store side alone, in a fresh child process of the harness
//! (`--child w14-sink`): `FileSink::store_path` (the call a `command` agent makes for each file
//! of its output directory) on the N files, 64 in flight, each on its own tokio task, into
//! `SqlStore` `sqlite:DIR/runs.db` with its defaults (WAL, `synchronous=FULL`); then every file
//! written out again with `FileSink::write_to_path` (what `runs files --output` does), one
//! after the other. The files are generated before the clock starts (they sit in the page
//! cache, as a command's fresh output does).
//!
//! One checked warm-up (every reference: even items share one hash, odd items each their own;
//! N/2 + 1 distinct hashes in the store; every file written out equal to its source, byte for
//! byte), then [`RUNS`] timed repetitions, each a fresh process and store, then one more process
//! at 2N for its peak RSS.
//!
//! Reported: `mb_per_s` = bytes of the files made (N × 100 KiB, duplicates included) / wall of
//! the stores, MB = 10^6 bytes; `store_bytes_per_item` = the database's files after the process
//! (`runs.db` and its `-wal`) / N; `ms_write_out` (all N files); `peak_rss_mb` at N and
//! `peak_rss_mb_2n` at 2N (the child's own `VmHWM`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::Options;
use crate::batch_bin;
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W14";
const FLOW: &str = "w14_files.yaml";
/// The size of every file.
pub const FILE_BYTES: usize = 100 << 10;
/// Files being stored at once (as `batch --concurrency 64` runs items).
const IN_FLIGHT: usize = 64;
const TARGET_MB_S: f64 = 200.0;
const TARGET_PEAK_RSS_MB: f64 = 150.0;

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let generated = util::GeneratedDir::create("w14", opts.keep_generated)?;
    let dir = &generated.path;
    let n = profile.w14_items;
    let src = dir.join("src");
    eprintln!("W14: generating {} files of {FILE_BYTES} bytes", 2 * n);
    write_sources(&src, 2 * n)?;
    let mut reports = Vec::new();
    reports.extend(run_sink(dir, &src, n, opts)?);
    reports.extend(run_batch(dir, &src, n, opts)?);
    Ok(reports)
}

/// The batch input: `{"i": k, "src": "SRC/k.bin", "name": "k.bin"}`.
fn write_batch_input(path: &Path, src: &Path, n: usize) -> Result<(), String> {
    let mut text = String::with_capacity(n * 100);
    for k in 0..n {
        let line = json!({"i": k, "src": src.join(format!("{k}.bin")).display().to_string(), "name": format!("{k}.bin")});
        text.push_str(&line.to_string());
        text.push('\n');
    }
    util::write_file(path, &text)
}

/// One batch in a fresh folder `dir/name` (its own SQLite store): with `files`, `--files
/// name/files`. Returns its exit, its peak RSS if `polled` (KiB), and the store's bytes.
fn batch(
    bin: &Path,
    dir: &Path,
    input: &Path,
    name: &str,
    files: bool,
    polled: bool,
) -> Result<(batch_bin::Exit, u64, u64, PathBuf), String> {
    let (cmd, _) = batch_bin::fresh_sqlite(bin, dir, input, name, IN_FLIGHT)?;
    let files_dir = cmd.cwd.join("files");
    let files_arg = files_dir.display().to_string();
    let extra: Vec<&str> = if files {
        vec!["--files", &files_arg]
    } else {
        vec![]
    };
    let flow = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bench")
        .join(FLOW);
    let (exit, hwm) = if polled {
        batch_bin::run_polled_with(&cmd, &flow, &extra)?
    } else {
        (batch_bin::run_with(&cmd, &flow, &extra)?, 0)
    };
    Ok((exit, hwm, store_bytes(&cmd.cwd)?, cmd.cwd))
}

/// Output line k is item k, succeeded, with `file` the reference to `k.bin` of the expected
/// hash; with `files`, `files/<k>/k.bin` holds its bytes.
fn check_batch(out_dir: &Path, n: usize, files: bool) -> Result<(), String> {
    use sha2::Digest;
    let hex = |b: &[u8]| switchyard::__private::store::blobs::hex(&sha2::Sha256::digest(b));
    let same = format!("sha256:{}", hex(&file_bytes(0)));
    let text = std::fs::read_to_string(out_dir.join("out.jsonl"))
        .map_err(|e| format!("cannot read the output: {e}"))?;
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() != n {
        return Err(format!("the output has {} lines for {n} items", lines.len()));
    }
    for (k, line) in lines.iter().enumerate() {
        let v: Value =
            serde_json::from_str(line).map_err(|e| format!("output line {}: not JSON ({e})", k + 1))?;
        if v["id"].as_u64() != Some(k as u64) || v["status"] != "succeeded" {
            return Err(format!(
                "output line {}: expected item {k}, succeeded: {line}",
                k + 1
            ));
        }
        let hash = if k.is_multiple_of(2) {
            same.clone()
        } else {
            format!("sha256:{}", hex(&file_bytes(k)))
        };
        let f = &v["output"]["file"];
        if f["file"] != hash.as_str() || f["name"] != format!("{k}.bin").as_str() || f["size"] != FILE_BYTES {
            return Err(format!(
                "output line {}: file {f} (expected {hash}, `{k}.bin`, {FILE_BYTES} bytes)",
                k + 1
            ));
        }
        if files {
            let path = out_dir.join("files").join(k.to_string()).join(format!("{k}.bin"));
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
            if bytes != file_bytes(k) {
                return Err(format!("`{}` is not item {k}'s bytes", path.display()));
            }
        }
    }
    Ok(())
}

fn run_batch(dir: &Path, src: &Path, n: usize, opts: &Options) -> Result<Vec<Report>, String> {
    let bin = util::release_binary()?;
    let input = dir.join(format!("in_{n}.jsonl"));
    write_batch_input(&input, src, n)?;
    let input_2n = dir.join(format!("in_{}.jsonl", 2 * n));
    write_batch_input(&input_2n, src, 2 * n)?;
    eprintln!(
        "W14 batch: `switchyard batch {FLOW} --concurrency {IN_FLIGHT} --store sqlite:DIR/runs.db` (a fresh DIR per \
         process), {n} items each making a file; warm-up with `--files`, then {RUNS} × (without, with `--files DIR`), \
         then peak RSS at {n} and {}",
        2 * n
    );
    let drop_dir = |d: &Path| {
        if !opts.keep_generated {
            let _ = std::fs::remove_dir_all(d);
        }
    };
    let (_, _, _, d) = batch(&bin, dir, &input, "warm-up", true, false)?;
    check_batch(&d, n, true)?;
    drop_dir(&d);
    let (mut rate, mut bytes, mut out_ms) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..RUNS {
        let (plain, _, b, d) = batch(&bin, dir, &input, &format!("rep{r}"), false, false)?;
        check_batch(&d, n, false)?;
        drop_dir(&d);
        let (with, _, _, d) = batch(&bin, dir, &input, &format!("rep{r}-files"), true, false)?;
        check_batch(&d, n, true)?;
        drop_dir(&d);
        rate.push((n * FILE_BYTES) as f64 / 1e6 / plain.wall_s);
        bytes.push(b as f64 / n as f64);
        out_ms.push((with.wall_s - plain.wall_s) * 1e3);
    }
    let (_, hwm_n, _, d) = batch(&bin, dir, &input, "rss-n", true, true)?;
    check_batch(&d, n, true)?;
    drop_dir(&d);
    let (_, hwm_2n, _, d) = batch(&bin, dir, &input_2n, "rss-2n", true, true)?;
    check_batch(&d, 2 * n, true)?;
    drop_dir(&d);
    let (rss_n, rss_2n) = (hwm_n as f64 / 1024.0, hwm_2n as f64 / 1024.0);
    eprintln!(
        "W14 batch: median {:.1} MB/s (target ≥ {TARGET_MB_S}), {:.0} bytes of store per item, `--files` adds {:.0} ms, \
         peak RSS {rss_n:.1} MiB at {n}, {rss_2n:.1} MiB at {} (target ≤ {TARGET_PEAK_RSS_MB})",
        median(&rate),
        median(&bytes),
        median(&out_ms),
        2 * n
    );
    let what = format!(
        "{n} items of `{FLOW}` (a `command` agent, `sh` + `cat SRC > $SWITCHYARD_OUTPUT_DIR/k.bin`, one file of \
         {FILE_BYTES} bytes per item, even items the same bytes) through `switchyard batch --concurrency {IN_FLIGHT} \
         --store sqlite:DIR/runs.db --id-field i` (a fresh database per process; release binary, spawn to exit)"
    );
    let variant = |mut r: Report| {
        r.variant = "batch".to_string();
        r
    };
    Ok(vec![
        variant(Report::new(
            ID,
            "mb_per_s",
            n as u64,
            rate,
            format!("{what}; bytes of the files made / wall, MB = 10^6 bytes; target ≥ {TARGET_MB_S}"),
        )),
        variant(Report::new(
            ID,
            "store_bytes_per_item",
            n as u64,
            bytes,
            format!(
                "{what}; bytes of `runs.db` and its `-wal` after the process / N: records and the files' bytes, each distinct file once"
            ),
        )),
        variant(Report::new(
            ID,
            "ms_write_out",
            n as u64,
            out_ms,
            format!(
                "{what}; wall with `--files DIR` (every item's file written out under DIR/<id>/) − wall without, ms"
            ),
        )),
        variant(Report::new(
            ID,
            "peak_rss_mb",
            n as u64,
            vec![rss_n],
            format!(
                "{what}, with `--files DIR`; VmHWM of one untimed batch, MiB; target ≤ {TARGET_PEAK_RSS_MB} at any N"
            ),
        )),
        variant(Report::new(
            ID,
            "peak_rss_mb_2n",
            2 * n as u64,
            vec![rss_2n],
            format!("the same at 2N = {} items; flat: ≈ peak_rss_mb", 2 * n),
        )),
    ])
}

/// What one `w14-sink` child measured.
struct SinkRun {
    store_s: f64,
    out_s: f64,
    store_bytes: u64,
    peak_rss_kib: u64,
}

fn sink_child(
    dir: &Path,
    src: &Path,
    n: usize,
    name: &str,
    check: bool,
    keep: bool,
) -> Result<SinkRun, String> {
    let sub = dir.join(name);
    if sub.exists() {
        std::fs::remove_dir_all(&sub).map_err(|e| format!("cannot empty `{}`: {e}", sub.display()))?;
    }
    std::fs::create_dir_all(sub.join("out"))
        .map_err(|e| format!("cannot create `{}`: {e}", sub.display()))?;
    let out = util::run_child(&[
        "w14-sink",
        &src.display().to_string(),
        &n.to_string(),
        &sub.display().to_string(),
        if check { "check" } else { "timed" },
    ])?;
    let f = util::parse_fields(&out)?;
    let store_bytes = store_bytes(&sub)?;
    if !keep {
        let _ = std::fs::remove_dir_all(&sub);
    }
    Ok(SinkRun {
        store_s: util::field(&f, "store_s")?,
        out_s: util::field(&f, "out_s")?,
        store_bytes,
        peak_rss_kib: util::field(&f, "peak_rss_kib")? as u64,
    })
}

fn run_sink(dir: &Path, src: &Path, n: usize, opts: &Options) -> Result<Vec<Report>, String> {
    let keep = opts.keep_generated;
    eprintln!(
        "W14 sink: FileSink::store_path of {n} files ({IN_FLIGHT} in flight) into a fresh SQLite store, then \
         write_to_path of each; warm-up, then {RUNS} timed, then {} for peak RSS",
        2 * n
    );
    let warm = sink_child(dir, src, n, "warm-up", true, keep)?;
    let distinct = (n / 2) as u64 + u64::from(n >= 1);
    check_store_bytes(warm.store_bytes, distinct)?;
    let (mut rate, mut bytes, mut out_ms, mut rss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..RUNS {
        let s = sink_child(dir, src, n, &format!("rep{r}"), false, keep)?;
        rate.push((n * FILE_BYTES) as f64 / 1e6 / s.store_s);
        bytes.push(s.store_bytes as f64 / n as f64);
        out_ms.push(s.out_s * 1e3);
        rss.push(s.peak_rss_kib as f64 / 1024.0);
    }
    let at_2n = sink_child(dir, src, 2 * n, "rss-2n", true, keep)?;
    let rss_2n = at_2n.peak_rss_kib as f64 / 1024.0;
    eprintln!(
        "W14 sink: median {:.0} MB/s (target ≥ {TARGET_MB_S}), {:.0} bytes of store per item ({} distinct of {n} files), \
         write-out {:.0} ms, peak RSS {:.1} MiB at {n}, {rss_2n:.1} MiB at {} (target ≤ {TARGET_PEAK_RSS_MB})",
        median(&rate),
        median(&bytes),
        distinct,
        median(&out_ms),
        median(&rss),
        2 * n
    );
    let what = format!(
        "{n} files of {FILE_BYTES} bytes (even items the same bytes, odd items distinct) stored with \
         FileSink::store_path, {IN_FLIGHT} in flight, into a fresh `sqlite:DIR/runs.db` (defaults: WAL, \
         synchronous=FULL), fresh process per repetition"
    );
    let variant = |mut r: Report| {
        r.variant = "sink".to_string();
        r
    };
    Ok(vec![
        variant(Report::new(
            ID,
            "mb_per_s",
            n as u64,
            rate,
            format!(
                "{what}; bytes of the files made (duplicates included) / wall of the stores, MB = 10^6 bytes; target ≥ {TARGET_MB_S}"
            ),
        )),
        variant(Report::new(
            ID,
            "store_bytes_per_item",
            n as u64,
            bytes,
            format!(
                "{what}; bytes of `runs.db` and its `-wal` after the process / N ({distinct} distinct files: duplicates \
                 cost nothing, so ≈ {} per item)",
                distinct as usize * FILE_BYTES / n
            ),
        )),
        variant(Report::new(
            ID,
            "ms_write_out",
            n as u64,
            out_ms,
            format!(
                "{what}; then every file written out with FileSink::write_to_path (hash checked), one after the other, ms"
            ),
        )),
        variant(Report::new(
            ID,
            "peak_rss_mb",
            n as u64,
            rss,
            format!("{what}; the process's VmHWM at its end, MiB; target ≤ {TARGET_PEAK_RSS_MB} at any N"),
        )),
        variant(Report::new(
            ID,
            "peak_rss_mb_2n",
            2 * n as u64,
            vec![rss_2n],
            format!(
                "the same at 2N = {} files (one untimed, checked process); flat: ≈ peak_rss_mb",
                2 * n
            ),
        )),
    ])
}

/// The distinct files are in the store once each: the store holds at least their bytes and
/// not much more (a duplicate stored again would add a whole file per item).
fn check_store_bytes(store_bytes: u64, distinct: u64) -> Result<(), String> {
    let floor = distinct * FILE_BYTES as u64;
    if store_bytes < floor || store_bytes > floor + floor / 10 + (4 << 20) {
        return Err(format!(
            "the store holds {store_bytes} bytes for {distinct} distinct files of {FILE_BYTES} bytes ({floor} bytes)"
        ));
    }
    Ok(())
}

/// The bytes of item `k`'s file: even items all the same, odd items their own (a line of text,
/// then pseudo-random bytes: nothing compresses or repeats).
pub fn file_bytes(k: usize) -> Vec<u8> {
    let mut x = if k.is_multiple_of(2) { 0x5eed } else { k as u64 } ^ 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(FILE_BYTES);
    out.extend_from_slice(b"switchyard W14\n");
    while out.len() < FILE_BYTES {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(FILE_BYTES);
    out
}

fn write_sources(src: &Path, n: usize) -> Result<(), String> {
    std::fs::create_dir_all(src).map_err(|e| format!("cannot create `{}`: {e}", src.display()))?;
    let same = file_bytes(0);
    for k in 0..n {
        let path = src.join(format!("{k}.bin"));
        let bytes = if k.is_multiple_of(2) {
            same.clone()
        } else {
            file_bytes(k)
        };
        std::fs::write(&path, bytes).map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    }
    Ok(())
}

/// The bytes of the SQLite database in `dir` once its process has exited.
pub fn store_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for name in ["runs.db", "runs.db-wal"] {
        match std::fs::metadata(dir.join(name)) {
            Ok(m) => total += m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "runs.db" => {}
            Err(e) => return Err(format!("cannot read `{}`: {e}", dir.join(name).display())),
        }
    }
    Ok(total)
}

/// `--child w14-sink SRC N DIR check|timed`: stores `SRC/0.bin` … `SRC/{N-1}.bin` through a
/// `FileSink` into `sqlite:DIR/runs.db`, then writes each out under `DIR/out/`. Prints
/// `store_s out_s peak_rss_kib`. `check` also checks every reference and written file.
pub fn child_sink(args: &[String]) -> Result<(), String> {
    use switchyard::__private::files::{FileLimits, FileSink};
    use switchyard::__private::store::Store;
    use switchyard::__private::store::sql::SqlStore;
    let [src, n, dir, mode] = args else {
        return Err("usage: w14-sink SRC N DIR check|timed".to_string());
    };
    let src = PathBuf::from(src);
    let dir = PathBuf::from(dir);
    let n: usize = n.parse().map_err(|_| format!("bad N `{n}`"))?;
    let check = mode == "check";
    let rt = util::tokio_runtime()?;
    let (refs, store_s, out_s) = rt.block_on(async {
        let url = format!("sqlite:{}", dir.join("runs.db").display());
        let store = SqlStore::open(&url)
            .await
            .map_err(|e| format!("cannot open `{url}`: {e}"))?;
        let sink = Arc::new(FileSink::new(store.blobs(), Arc::new(FileLimits::default())));
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let mut refs = vec![None; n];
        let mut next = 0;
        while next < n || !tasks.is_empty() {
            while next < n && tasks.len() < IN_FLIGHT {
                let (sink, path, k) = (sink.clone(), src.join(format!("{next}.bin")), next);
                tasks.spawn(async move { (k, sink.store_path(&path, format!("{k}.bin")).await) });
                next += 1;
            }
            let (k, r) = tasks
                .join_next()
                .await
                .expect("a task is in flight")
                .map_err(|e| format!("a store task failed: {e}"))?;
            refs[k] = Some(r.map_err(|e| format!("storing file {k}: {}", e.message))?);
        }
        let store_s = t0.elapsed().as_secs_f64();
        let refs: Vec<_> = refs.into_iter().map(|r| r.expect("every item stored")).collect();
        let t1 = Instant::now();
        for r in &refs {
            sink.write_to_path(r, &dir.join("out").join(&r.name))
                .await
                .map_err(|e| format!("writing out {}: {}", r.name, e.message))?;
        }
        let out_s = t1.elapsed().as_secs_f64();
        store.close().await;
        Ok::<_, String>((refs, store_s, out_s))
    })?;
    if check {
        check_child(&src, &dir, &refs)?;
    }
    println!(
        "store_s={store_s} out_s={out_s} peak_rss_kib={}",
        util::peak_rss_kib()?
    );
    Ok(())
}

fn check_child(
    src: &Path,
    dir: &Path,
    refs: &[switchyard::__private::record::files::FileRef],
) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (k, r) in refs.iter().enumerate() {
        if r.name != format!("{k}.bin") || r.size != FILE_BYTES as u64 {
            return Err(format!("file {k}: unexpected reference {r:?}"));
        }
        let shared = k.is_multiple_of(2) && k > 0;
        if shared != (refs[0].file == r.file && k > 0) {
            return Err(format!("file {k}: hash {} (file 0: {})", r.file, refs[0].file));
        }
        seen.insert(r.file.clone());
        let a = std::fs::read(src.join(&r.name)).map_err(|e| format!("cannot read source {k}: {e}"))?;
        let b = std::fs::read(dir.join("out").join(&r.name))
            .map_err(|e| format!("cannot read output {k}: {e}"))?;
        if a != b {
            return Err(format!("file {k} written out differs from its source"));
        }
    }
    let want = refs.len() / 2 + usize::from(!refs.is_empty());
    if seen.len() != want {
        return Err(format!(
            "{} distinct hashes for {} files (want {want})",
            seen.len(),
            refs.len()
        ));
    }
    Ok(())
}
