//! W13 MCP tools (BENCH.md): N items `{i: k}` of `w13_mcp.yaml`, one plain `mcp` step each
//! calling the `add` tool of the project's MCP test server (`examples/mcp_fixture.rs`, release
//! build, next to this harness) over stdio, through the release
//! `switchyard batch --concurrency 64 --id-field i --store memory` as a whole process; and the
//! same step over Streamable HTTP (`w13_mcp_http.yaml`) against one fixture server the harness
//! starts with `--http 127.0.0.1:0`.
//!
//! Engine time: the batch process's own CPU time (user + system of all its threads), without
//! the server's. The harness waits for the process's exit with `waitid(WNOWAIT)`, which leaves
//! it a zombie, and reads `/proc/PID/stat` then: `utime + stime` are the process's own threads,
//! `cutime + cstime` the children it reaped (the stdio server and whatever ran beside it), in
//! clock ticks (10 ms); only then is it reaped with `wait4`. Start-up (loading the flow,
//! starting the server, `tools/list`) and shutdown are included: `cpu_us_per_call` is the whole
//! process over N. `marginal_cpu_us_per_call` = (own CPU at N − at N/2) / (N/2) takes them out.
//!
//! Servers: the fixture appends its pid to the file named by `MCP_FIXTURE_PIDS` (written into
//! the generated flow's `env:`): after every stdio batch it must hold exactly one pid, and no
//! process of that pid may be alive. Every output is checked (line k is item k, succeeded,
//! `{i: k, result: 2k}`). Peak RSS: `VmHWM` polled every millisecond in an untimed run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Options;
use crate::batch_bin::{self, BatchCmd, Exit};
use crate::profile::{Profile, RUNS};
use crate::report::{Report, median};
use crate::util;

pub const ID: &str = "W13";
const CONCURRENCY: usize = 64;
const STDIO_FLOW: &str = "w13_mcp.yaml";
const HTTP_FLOW: &str = "w13_mcp_http.yaml";
/// The `command:` line of `w13_mcp.yaml`, replaced in its generated copy.
const PLACEHOLDER_COMMAND: &str = "    command: [../../target/release/examples/mcp_fixture]\n";
/// The `url:` of `w13_mcp_http.yaml`, replaced in its generated copy.
const PLACEHOLDER_URL: &str = "http://127.0.0.1:9/mcp";
const TARGET_US_PER_CALL: f64 = 50.0;
const TARGET_CALLS_S: f64 = 5000.0;

fn bench_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/bench")
        .join(name)
}

/// The release fixture server, `target/release/examples/mcp_fixture`.
fn fixture_binary(bin: &Path) -> Result<PathBuf, String> {
    let path = bin
        .parent()
        .ok_or("the release binary has no folder")?
        .join("examples")
        .join(format!("mcp_fixture{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        return Err(format!(
            "`{}` not found: build it with `cargo build --release --examples --bins`",
            path.display()
        ));
    }
    Ok(path)
}

/// Writes a copy of the bench flow `name` into `dir` with `from` replaced by `to`.
fn generate_flow(dir: &Path, name: &str, from: &str, to: &str) -> Result<PathBuf, String> {
    let src = bench_file(name);
    let text = std::fs::read_to_string(&src).map_err(|e| format!("cannot read `{}`: {e}", src.display()))?;
    if !text.contains(from) {
        return Err(format!("`{}` no longer holds `{}`", src.display(), from.trim()));
    }
    let path = dir.join(name);
    util::write_file(&path, &text.replacen(from, to, 1))?;
    Ok(path)
}

/// One measured batch process.
struct Measured {
    exit: Exit,
    /// CPU time of the process's own threads (`utime + stime`), seconds.
    own_cpu_s: f64,
    /// CPU time of the children it reaped (`cutime + cstime`), seconds.
    children_cpu_s: f64,
    /// `VmHWM`, KiB, when polled.
    peak_kib: Option<u64>,
}

fn clock_ticks() -> f64 {
    // SAFETY: `sysconf` reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// `(utime + stime, cutime + cstime)` of `/proc/PID/stat`, in seconds.
fn proc_cpu(pid: u32) -> Result<(f64, f64), String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    // Fields after the command name (which may hold spaces) start at field 3 (the state).
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| format!("`{path}`: {text}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<f64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(|| format!("`{path}` has no field {}: {text}", i + 3))
    };
    // utime is field 14, stime 15, cutime 16, cstime 17.
    let hz = clock_ticks();
    Ok(((tick(11)? + tick(12)?) / hz, (tick(13)? + tick(14)?) / hz))
}

/// Whether `pid` has exited, leaving it unreaped (a zombie whose `/proc` entry can be read).
/// With `block`, waits for it.
fn exited_unreaped(child: &Child, block: bool) -> Result<bool, String> {
    let pid = child.id() as libc::id_t;
    loop {
        // SAFETY: `waitid` writes only into the siginfo it is given; zero is a valid siginfo.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let mut flags = libc::WEXITED | libc::WNOWAIT;
        if !block {
            flags |= libc::WNOHANG;
        }
        // SAFETY: as above; `pid` is our own unreaped child.
        let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) };
        if r == 0 {
            // SAFETY: `si_pid` is valid for the SIGCHLD siginfo `waitid` fills.
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("waitid({pid}): {e}"));
        }
    }
}

/// Runs one batch to its end: its exit, its own and its children's CPU read from its zombie,
/// and, with `poll_rss`, its `VmHWM` read every millisecond (do not time those).
fn run_batch(cmd: &BatchCmd, flow: &Path, poll_rss: bool) -> Result<Measured, String> {
    let (child, t0) = batch_bin::spawn_flow(cmd, flow)?;
    let mut peak = None;
    if poll_rss {
        let status = format!("/proc/{}/status", child.id());
        let mut hwm = 0u64;
        while !exited_unreaped(&child, false)? {
            if let Some(v) = std::fs::read_to_string(&status)
                .ok()
                .as_deref()
                .and_then(vm_hwm_kib)
            {
                hwm = hwm.max(v);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if hwm == 0 {
            return Err("never read the batch's VmHWM".to_string());
        }
        peak = Some(hwm);
    } else {
        exited_unreaped(&child, true)?;
    }
    let (own_cpu_s, children_cpu_s) = proc_cpu(child.id())?;
    let exit = batch_bin::reap(&child, t0, true)?.ok_or("wait4 returned nothing")?;
    if !exit.success() {
        return Err(format!(
            "`switchyard batch {}` ({} items) ended with {}: {}",
            flow.display(),
            batch_bin::count_lines(&cmd.input),
            exit.describe(),
            batch_bin::log_tail(&cmd.log)
        ));
    }
    batch_bin::check_output(&cmd.output, batch_bin::count_lines(&cmd.input))?;
    Ok(Measured {
        exit,
        own_cpu_s,
        children_cpu_s,
        peak_kib: peak,
    })
}

fn vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The pids a fixture's pid file holds (none if it does not exist).
fn read_pids(path: &Path) -> Result<Vec<u32>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .map(|l| {
                l.trim()
                    .parse()
                    .map_err(|_| format!("`{}`: bad pid `{l}`", path.display()))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
    }
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// After a stdio batch: exactly one server was started, and it is gone (allowing a moment for
/// a process that is being reaped by someone else).
fn check_servers(pids_file: &Path) -> Result<usize, String> {
    let pids = read_pids(pids_file)?;
    if pids.len() != 1 {
        return Err(format!(
            "the batch started {} fixture server processes ({pids:?}), not 1",
            pids.len()
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| alive(p)) {
        if Instant::now() >= deadline {
            return Err(format!(
                "fixture server {pids:?} still running after its batch exited"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(pids_file);
    Ok(pids.len())
}

/// The fixture serving Streamable HTTP on loopback, killed when dropped.
struct HttpFixture {
    child: Child,
    url: String,
}

impl HttpFixture {
    fn start(fixture: &Path, pids_file: &Path) -> Result<HttpFixture, String> {
        use std::io::BufRead;
        let mut child = Command::new(fixture)
            .args(["--http", "127.0.0.1:0"])
            .env("MCP_FIXTURE_PIDS", pids_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", fixture.display()))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("the fixture's stdout")?;
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("cannot read the fixture's URL: {e}"))?;
        let url = line.trim().to_string();
        if !url.starts_with("http://127.0.0.1:") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the fixture printed `{url}`, not its URL"));
        }
        Ok(HttpFixture { child, url })
    }

    /// The server's CPU time so far (user + system, ticks), seconds.
    fn cpu_s(&self) -> Result<f64, String> {
        proc_cpu(self.child.id()).map(|(own, _)| own)
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The samples of one variant.
#[derive(Default)]
struct Samples {
    rate: Vec<f64>,
    cpu: Vec<f64>,
    marginal: Vec<f64>,
    server_cpu: Vec<f64>,
    servers: Vec<f64>,
}

pub fn run(profile: &Profile, opts: &Options) -> Result<Vec<Report>, String> {
    let bin = util::release_binary()?;
    let fixture = fixture_binary(&bin)?;
    let generated = util::GeneratedDir::create("w13", opts.keep_generated)?;
    let dir = &generated.path;
    let n = profile.w13_items;
    let half = n / 2;
    let (input_n, input_half) = (
        dir.join(format!("in_{n}.jsonl")),
        dir.join(format!("in_{half}.jsonl")),
    );
    batch_bin::write_input(&input_n, n)?;
    batch_bin::write_input(&input_half, half)?;
    let cmd = |input: &Path, tag: &str| BatchCmd {
        bin: bin.clone(),
        input: input.to_path_buf(),
        output: dir.join(format!("out_{tag}.jsonl")),
        concurrency: CONCURRENCY,
        store: "memory".to_string(),
        cwd: dir.clone(),
        log: dir.join(format!("log_{tag}.txt")),
    };
    let mut reports = Vec::new();

    // stdio: the engine starts the server.
    let pids = dir.join("stdio.pids");
    let command = format!(
        "    command: [{}]\n    env: {{MCP_FIXTURE_PIDS: {}}}\n",
        serde_json::to_string(&fixture.display().to_string()).map_err(|e| e.to_string())?,
        serde_json::to_string(&pids.display().to_string()).map_err(|e| e.to_string())?,
    );
    let stdio_flow = generate_flow(dir, STDIO_FLOW, PLACEHOLDER_COMMAND, &command)?;
    eprintln!(
        "W13 stdio: `switchyard batch {STDIO_FLOW} --concurrency {CONCURRENCY} --store memory`, {n} and {half} \
         items; warm-up, then {RUNS} timed of each, then peak RSS"
    );
    let (at_n, at_half) = (cmd(&input_n, "stdio"), cmd(&input_half, "stdio_half"));
    let _ = std::fs::remove_file(&pids);
    run_batch(&at_n, &stdio_flow, false)?;
    check_servers(&pids)?;
    let mut s = Samples::default();
    for _ in 0..RUNS {
        let m = run_batch(&at_n, &stdio_flow, false)?;
        s.servers.push(check_servers(&pids)? as f64);
        let h = run_batch(&at_half, &stdio_flow, false)?;
        check_servers(&pids)?;
        s.rate.push(n as f64 / m.exit.wall_s);
        s.cpu.push(m.own_cpu_s * 1e6 / n as f64);
        s.marginal
            .push((m.own_cpu_s - h.own_cpu_s) * 1e6 / (n - half) as f64);
        s.server_cpu.push(m.children_cpu_s * 1e6 / n as f64);
    }
    let rss = run_batch(&at_n, &stdio_flow, true)?;
    check_servers(&pids)?;
    let peak_mb = rss.peak_kib.unwrap_or(0) as f64 / 1024.0;
    eprintln!(
        "W13 stdio: median {:.0} calls/s (target ≥ {TARGET_CALLS_S}), engine CPU {:.1} µs per call (target ≤ \
         {TARGET_US_PER_CALL}), {:.1} µs marginal, server and children {:.1} µs per call, 1 server per batch, \
         peak RSS {peak_mb:.1} MiB",
        median(&s.rate),
        median(&s.cpu),
        median(&s.marginal),
        median(&s.server_cpu),
    );
    let what = format!(
        "{n} items `{{i: k}}` of `{STDIO_FLOW}` (one `mcp` step: the fixture's `add` over stdio) through `switchyard \
         batch --concurrency {CONCURRENCY} --store memory --id-field i` (release binary and fixture, whole process)"
    );
    reports.extend(variant_reports(&what, n, s, peak_mb, "stdio", true));

    // Streamable HTTP: the harness starts the server, once.
    let http_pids = dir.join("http.pids");
    let server = HttpFixture::start(&fixture, &http_pids)?;
    let http_flow = generate_flow(dir, HTTP_FLOW, PLACEHOLDER_URL, &server.url)?;
    eprintln!(
        "W13 http: `switchyard batch {HTTP_FLOW} --concurrency {CONCURRENCY} --store memory` against {}, {n} and \
         {half} items; warm-up, then {RUNS} timed of each, then peak RSS",
        server.url
    );
    let (at_n, at_half) = (cmd(&input_n, "http"), cmd(&input_half, "http_half"));
    run_batch(&at_n, &http_flow, false)?;
    let mut s = Samples::default();
    for _ in 0..RUNS {
        let before = server.cpu_s()?;
        let m = run_batch(&at_n, &http_flow, false)?;
        let server_cpu = server.cpu_s()? - before;
        let h = run_batch(&at_half, &http_flow, false)?;
        s.rate.push(n as f64 / m.exit.wall_s);
        s.cpu.push(m.own_cpu_s * 1e6 / n as f64);
        s.marginal
            .push((m.own_cpu_s - h.own_cpu_s) * 1e6 / (n - half) as f64);
        s.server_cpu.push(server_cpu * 1e6 / n as f64);
    }
    let rss = run_batch(&at_n, &http_flow, true)?;
    let started = read_pids(&http_pids)?;
    if started.len() != 1 {
        return Err(format!(
            "{} fixture HTTP servers were started, not 1",
            started.len()
        ));
    }
    drop(server);
    let peak_mb = rss.peak_kib.unwrap_or(0) as f64 / 1024.0;
    eprintln!(
        "W13 http: median {:.0} calls/s, engine CPU {:.1} µs per call, {:.1} µs marginal, server {:.1} µs per call, \
         peak RSS {peak_mb:.1} MiB",
        median(&s.rate),
        median(&s.cpu),
        median(&s.marginal),
        median(&s.server_cpu),
    );
    let what = format!(
        "{n} items `{{i: k}}` of `{HTTP_FLOW}` (one `mcp` step: the fixture's `add` over Streamable HTTP, one server \
         on loopback started by the harness) through `switchyard batch --concurrency {CONCURRENCY} --store memory \
         --id-field i` (release binary and fixture, whole process)"
    );
    reports.extend(variant_reports(&what, n, s, peak_mb, "http", false));
    Ok(reports)
}

fn variant_reports(
    what: &str,
    n: usize,
    s: Samples,
    peak_mb: f64,
    variant: &str,
    stdio: bool,
) -> Vec<Report> {
    let half = n / 2;
    let target = |t: &str| {
        if stdio {
            format!("; target {t}")
        } else {
            String::new()
        }
    };
    let mut reports = vec![
        Report::new(
            ID,
            "items_per_s",
            n as u64,
            s.rate,
            format!(
                "{what}; N / wall, spawn to exit{}",
                target(&format!("≥ {TARGET_CALLS_S}"))
            ),
        ),
        Report::new(
            ID,
            "cpu_us_per_call",
            n as u64,
            s.cpu,
            format!(
                "{what}; the batch process's own CPU (utime + stime of its threads, read from its zombie's \
                 /proc/PID/stat, 10 ms ticks; the server's CPU is not in it) / N, start-up and shutdown \
                 included{}",
                target(&format!("≤ {TARGET_US_PER_CALL} µs"))
            ),
        ),
        Report::new(
            ID,
            "marginal_cpu_us_per_call",
            n as u64,
            s.marginal,
            format!(
                "{what}; (own CPU at N − own CPU at {half}) / {}: one more call, start-up taken out",
                n - half
            ),
        ),
        Report::new(
            ID,
            "server_cpu_us_per_call",
            n as u64,
            s.server_cpu,
            if stdio {
                format!(
                    "{what}; the CPU of the children the batch reaped (cutime + cstime: the server) / N, for reading"
                )
            } else {
                format!("{what}; the server's CPU over the batch (its /proc/PID/stat) / N, for reading")
            },
        ),
        Report::new(
            ID,
            "peak_rss_mb",
            n as u64,
            vec![peak_mb],
            format!("{what}; VmHWM of the batch process in one untimed batch, MiB"),
        ),
    ];
    if stdio {
        reports.push(Report::new(
            ID,
            "servers_started",
            n as u64,
            s.servers,
            format!(
                "{what}; fixture pids written per batch (MCP_FIXTURE_PIDS), none alive after it; target 1"
            ),
        ));
    }
    for r in &mut reports {
        r.variant = variant.to_string();
    }
    reports
}
