//! Shared pieces of the escape corpus (tests/tests/escape_*.rs, issue 17):
//! each file runs many escape attempts in one sandbox session, as one
//! shell script that prints one line per case, and parses those lines.
//!
//! A case line is `case NAME: VERDICT...`: `refused ...` when the attempt
//! failed, `ESCAPED ...` when it succeeded; a file may print other
//! verdicts for cases its test judges itself. The attempts that need a
//! raw system call (ioctls, ptrace, mknod, setxattr, open_by_handle_at)
//! go through [`PERL_TOOL`]: the test image is Debian, whose essential
//! `perl-base` offers `syscall` and `ioctl` (no compiler needed, no probe
//! rebuilt per attempt). The tool hard-codes x86_64 system call numbers
//! and refuses to run elsewhere.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::TestEnv;

/// Shell functions every escape script starts with (after `W=WORKSPACE`
/// and `TOOL=...`, set and exported by [`install`], so that `sh -c` cases
/// can run `perl "$TOOL"`):
///
/// - `must_fail NAME CMD...` runs CMD and prints `case NAME: refused
///   (exit S): OUTPUT` if it fails, `case NAME: ESCAPED: OUTPUT` if it
///   succeeds (output on one line, cut to 240 characters);
/// - `tool ARGS...` runs [`PERL_TOOL`].
pub const PRELUDE: &str = r#"
oneline() { tr '\n\r' '  ' | cut -c1-240; }
tool() { perl "$TOOL" "$@"; }
must_fail() {
    n=$1; shift
    o=$("$@" 2>&1); s=$?
    o=$(printf '%s' "$o" | oneline)
    if [ "$s" -eq 0 ]; then echo "case $n: ESCAPED: $o"; else echo "case $n: refused (exit $s): $o"; fi
}
"#;

/// A small system-call tool in Perl, run inside the sandbox as `tool OP
/// ARGS...`. It exits 0 only when the attempt succeeded (and then says
/// `ok` and what it got), else 1 with the error.
///
/// - `ioctl FD|PATH REQ int|str|pack:FMT|none [VALUE]`: `ioctl(2)` with
///   request REQ (hex) and an integer, a pointer to the string VALUE, a
///   pointer to `pack(FMT, split /,/, VALUE)`, or 0;
/// - `sti FD|PATH TEXT`: TIOCSTI, one call per byte of TEXT (`\r`, `\n`
///   in TEXT stand for CR and LF);
/// - `mknod PATH b|c MAJOR MINOR`, `readdev PATH` (open and read 16 bytes);
/// - `ptrace PID`: PTRACE_ATTACH (detaches again on success);
/// - `vmread PID`: process_vm_readv of one page at the target's stack;
/// - `setxattr PATH NAME VALUE`; `truncate PATH` (truncate(2) by name);
/// - `open PATH FLAGS`: FLAGS of `w` (O_WRONLY), `rw`, `t` (O_TRUNC), `a`
///   (O_APPEND), `c` (O_CREAT); writes `evil` when it opened for writing;
/// - `reopen PATH`: opens read-only, then `/proc/self/fd/N` for writing;
/// - `rename FROM TO`, `link FROM TO`: the plain system calls;
/// - `handle`: the "shocker" escape, open_by_handle_at on `/` with a handle
///   of inode 2 (the root of most host file systems);
/// - `init_module`: load an (empty) kernel module;
/// - `fds SECRET`: reads every descriptor of every process (through
///   `/proc/PID/fd/N`, non-blocking) looking for SECRET; exits 0 if found;
/// - `writefds TEXT`: writes TEXT to each of its own descriptors 3 to 1023
///   (inherited ones: a leaked socket or file would take it);
/// - `myip [DEST]`: the local IPv4 address a datagram to DEST would leave from;
/// - `connect unix PATH|@NAME` / `connect tcp HOST PORT`: connects and
///   reads a line; `listen unix PATH|@NAME FILE` / `listen tcp PORT FILE`:
///   accepts forever, appending `accepted` to FILE per connection.
pub const PERL_TOOL: &str = r#"
use strict; use warnings; use Fcntl; use Socket; use POSIX ();
my %nr = (ptrace => 101, mknod => 133, setxattr => 188, init_module => 175,
          name_to_handle_at => 303, open_by_handle_at => 304, process_vm_readv => 310);
die "x86_64 only\n" unless (POSIX::uname())[4] eq 'x86_64';
my ($op, @a) = @ARGV;
$op //= '';
sub fail { print "$_[0]: $!\n"; exit 1 }
sub fh_of {
    my ($t) = @_; my $fh;
    if ($t =~ /^\d+$/) { open($fh, '+<&=', $t) or open($fh, '<&=', $t) or fail("fd $t") }
    else { sysopen($fh, $t, O_RDWR | O_NOCTTY) or sysopen($fh, $t, O_RDONLY | O_NOCTTY) or fail("open $t") }
    $fh
}
if ($op eq 'ioctl') {
    my ($t, $req, $kind, $v) = @a; my $fh = fh_of($t);
    my $arg = $kind eq 'int' ? 0 + $v : $kind eq 'str' ? "$v" : $kind =~ /^pack:(.*)/ ? pack($1, split(/,/, $v)) : 0;
    my $r = ioctl($fh, hex($req), $arg); defined $r or fail("ioctl $req"); print "ok ioctl $req\n"; exit 0;
} elsif ($op eq 'sti') {
    my ($t, $text) = @a; my $fh = fh_of($t); $text =~ s/\\r/\r/g; $text =~ s/\\n/\n/g;
    for my $c (split //, $text) { my $b = $c; defined ioctl($fh, 0x5412, $b) or fail("TIOCSTI") }
    print "ok injected\n"; exit 0;
} elsif ($op eq 'mknod') {
    my ($p, $k, $maj, $min) = @a; my $mode = ($k eq 'b' ? 0060000 : 0020000) | 0666;
    my $dev = ($maj << 8) | $min;
    syscall($nr{mknod}, $p, $mode, $dev) == 0 or fail("mknod $p"); print "ok mknod $p\n"; exit 0;
} elsif ($op eq 'readdev') {
    sysopen(my $fh, $a[0], O_RDONLY | O_NONBLOCK) or fail("open $a[0]");
    my $n = sysread($fh, my $buf, 16); defined $n or fail("read $a[0]"); print "ok read $n bytes\n"; exit 0;
} elsif ($op eq 'ptrace') {
    my $r = syscall($nr{ptrace}, 16, 0 + $a[0], 0, 0); $r == 0 or fail("PTRACE_ATTACH $a[0]");
    syscall($nr{ptrace}, 17, 0 + $a[0], 0, 0); print "ok attached $a[0]\n"; exit 0;
} elsif ($op eq 'vmread') {
    my $buf = "\0" x 64; my $local = pack('QQ', unpack('Q', pack('p', $buf)), 64);
    # The target's stack start if its /proc entry shows (a guess otherwise):
    # the call is made either way.
    my $stat = ''; if (open(my $f, '<', "/proc/$a[0]/stat")) { local $/; $stat = <$f> }
    my $addr = ($stat ? (split ' ', (split /\) /, $stat)[1] // '')[25] : 0) || 4096;
    my $remote = pack('QQ', $addr, 64);
    my $r = syscall($nr{process_vm_readv}, 0 + $a[0], $local, 1, $remote, 1, 0); $r > 0 or fail("process_vm_readv $a[0]");
    print "ok read $r bytes\n"; exit 0;
} elsif ($op eq 'setxattr') {
    my ($p, $n, $v) = @a; syscall($nr{setxattr}, $p, $n, $v, length($v), 0) == 0 or fail("setxattr $p"); print "ok\n"; exit 0;
} elsif ($op eq 'truncate') {
    truncate($a[0], 0) or fail("truncate $a[0]"); print "ok\n"; exit 0;
} elsif ($op eq 'open') {
    my ($p, $f) = @a; my $fl = $f =~ /rw/ ? O_RDWR : $f =~ /w/ ? O_WRONLY : O_RDONLY;
    $fl |= O_TRUNC if $f =~ /t/; $fl |= O_APPEND if $f =~ /a/; $fl |= O_CREAT if $f =~ /c/;
    sysopen(my $fh, $p, $fl, 0644) or fail("open $p");
    if ($fl & (O_WRONLY | O_RDWR)) { defined syswrite($fh, "evil\n") or fail("write $p") }
    print "ok opened $p\n"; exit 0;
} elsif ($op eq 'reopen') {
    sysopen(my $fh, $a[0], O_RDONLY) or fail("open $a[0]");
    my $n = fileno($fh); sysopen(my $w, "/proc/self/fd/$n", O_WRONLY) or fail("reopen $a[0]");
    defined syswrite($w, "evil\n") or fail("write"); print "ok\n"; exit 0;
} elsif ($op eq 'rename') {
    rename($a[0], $a[1]) or fail("rename"); print "ok\n"; exit 0;
} elsif ($op eq 'link') {
    link($a[0], $a[1]) or fail("link"); print "ok\n"; exit 0;
} elsif ($op eq 'handle') {
    sysopen(my $root, '/', O_RDONLY | O_DIRECTORY) or fail("open /");
    my $h = pack('LlLL', 8, 1, 2, 0);
    my $fd = syscall($nr{open_by_handle_at}, fileno($root), $h, O_RDONLY | O_DIRECTORY);
    $fd >= 0 or fail("open_by_handle_at"); print "ok fd $fd\n"; exit 0;
} elsif ($op eq 'init_module') {
    my ($img, $params) = ("\0" x 64, "\0"); syscall($nr{init_module}, $img, 64, $params) == 0 or fail("init_module"); print "ok\n"; exit 0;
} elsif ($op eq 'fds') {
    my ($secret) = @a; my ($opened, $found) = (0, '');
    for my $l (glob('/proc/[0-9]*/fd/*')) {
        sysopen(my $fh, $l, O_RDONLY | O_NONBLOCK | O_NOCTTY) or next; $opened++;
        my $n = sysread($fh, my $buf, 65536); next unless $n;
        $found .= " $l" if index($buf, $secret) >= 0;
    }
    if ($found) { print "ok found in$found\n"; exit 0 } print "opened $opened descriptors, none held it\n"; exit 1;
} elsif ($op eq 'writefds') {
    my ($text) = @a; my @hit;
    for my $fd (3..1023) { my $r = POSIX::write($fd, $text, length $text); push @hit, $fd if defined $r }
    if (@hit) { print "ok wrote to descriptors @hit\n"; exit 0 } print "no descriptor beyond stdio took a write\n"; exit 1;
} elsif ($op eq 'myip') {
    socket(my $s, AF_INET, SOCK_DGRAM, 0) or fail("socket");
    connect($s, pack_sockaddr_in(53, inet_aton($a[0] // '11.1.1.1'))) or fail("connect");
    my ($port, $ip) = unpack_sockaddr_in(getsockname($s)); print inet_ntoa($ip), "\n"; exit 0;
} elsif ($op eq 'connect') {
    my ($kind, $x, $port) = @a; my $s;
    if ($kind eq 'unix') {
        socket($s, AF_UNIX, SOCK_STREAM, 0) or fail("socket"); my $name = $x =~ s/^@/\0/r;
        connect($s, pack_sockaddr_un($name)) or fail("connect $x");
    } else {
        socket($s, AF_INET, SOCK_STREAM, 0) or fail("socket");
        my $ip = inet_aton($x) or fail("address $x");
        local $SIG{ALRM} = sub { print "connect $x:$port: timed out\n"; exit 1 }; alarm 5;
        connect($s, pack_sockaddr_in($port, $ip)) or fail("connect $x:$port"); alarm 0;
    }
    my $line = <$s> // ''; chomp $line; print "ok connected, read '$line'\n"; exit 0;
} elsif ($op eq 'listen') {
    my ($kind, $x, $file) = @a; my $s;
    if ($kind eq 'unix') {
        socket($s, AF_UNIX, SOCK_STREAM, 0) or fail("socket"); my $name = $x =~ s/^@/\0/r;
        bind($s, pack_sockaddr_un($name)) or fail("bind $x");
    } else {
        socket($s, AF_INET, SOCK_STREAM, 0) or fail("socket"); setsockopt($s, SOL_SOCKET, SO_REUSEADDR, 1);
        bind($s, pack_sockaddr_in($x, INADDR_ANY)) or fail("bind $x");
        $file = $a[2] // $a[1];
    }
    listen($s, 16) or fail("listen"); print "listening\n"; $| = 1;
    while (accept(my $c, $s)) {
        if (open(my $f, ">>", $file)) { print $f "accepted\n"; close $f } syswrite($c, "hello from the other Domain\n");
    }
    exit 0;
}
print "unknown op '$op'\n"; exit 2;
"#;

/// Writes [`PERL_TOOL`] and `script` (after [`PRELUDE`], with `W` and
/// `TOOL` set) into the workspace, which the sandbox sees at the same path,
/// and returns the script's path (run it with `sh PATH`).
pub fn install(env: &TestEnv, name: &str, script: &str) -> PathBuf {
    install_in(&env.workspace, name, script)
}

/// Like [`install`], into the workspace `workspace` (another Domain's).
pub fn install_in(workspace: &Path, name: &str, script: &str) -> PathBuf {
    let tool = workspace.join(".escape-tool.pl");
    fs::write(&tool, PERL_TOOL).expect("writing the escape tool");
    let path = workspace.join(format!(".escape-{name}.sh"));
    let text = format!(
        "W={}\nTOOL={}\nexport W TOOL\n{PRELUDE}\n{script}\necho 'case script-finished: done'\n",
        workspace.display(),
        tool.display()
    );
    fs::write(&path, text).expect("writing the escape script");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod escape script");
    path
}

/// The case lines of `stdout`: name → verdict (the text after `NAME: `).
pub fn cases(stdout: &str) -> BTreeMap<String, String> {
    // On a terminal, the client's progress line ends in CR and an
    // erase-line sequence, not a newline, before the first case.
    stdout
        .split(['\n', '\r'])
        .filter_map(|l| l.trim_start_matches("\x1b[2K").strip_prefix("case "))
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Asserts that the script ran to its end and that each of `names` was
/// refused, listing every case that escaped or is missing at once (with
/// the whole output, to see what happened).
pub fn assert_refused(results: &BTreeMap<String, String>, names: &[&str], output: &str) {
    assert!(results.contains_key("script-finished"), "the escape script did not run to its end:\n{output}");
    let bad: Vec<String> = names
        .iter()
        .filter_map(|n| match results.get(*n) {
            Some(v) if v.starts_with("refused") => None,
            Some(v) => Some(format!("{n}: {v}")),
            None => Some(format!("{n}: no result")),
        })
        .collect();
    assert!(bad.is_empty(), "escape attempts that did not fail as expected:\n  {}\nwhole output:\n{output}", bad.join("\n  "));
}
