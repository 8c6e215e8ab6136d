#!/usr/bin/env python3
"""Init time of a Lambda bootstrap as Lambda defines it: from starting the
process to its first GET /runtime/invocation/next, against a stand-in
Runtime API that never answers (docs/benchmarks.md, "Package size").

    scripts/init_time.py BINARY [RUNS] [--cold]

--cold evicts the binary's pages from the page cache before each start
(posix_fadvise DONTNEED), so the figure includes reading it from disk.
Prints the median in ms.
"""
import os
import socket
import statistics
import subprocess
import sys
import time


def once(binary: str, cold: bool) -> float:
    if cold:
        fd = os.open(binary, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        env = dict(
            os.environ,
            AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{server.getsockname()[1]}",
            AWS_LAMBDA_FUNCTION_NAME="init-probe",
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE="1024",
            AWS_LAMBDA_FUNCTION_VERSION="$LATEST",
            AWS_LAMBDA_LOG_LEVEL="error",
        )
        start = time.perf_counter()
        proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            conn, _ = server.accept()
            with conn:
                seen = b""
                while b"invocation/next" not in seen:
                    chunk = conn.recv(4096)
                    if not chunk:
                        raise SystemExit(f"{binary} closed the connection before asking for an invocation")
                    seen += chunk
            return (time.perf_counter() - start) * 1000
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--cold"]
    if not args:
        raise SystemExit(__doc__)
    binary, runs, cold = args[0], int(args[1]) if len(args) > 1 else 10, "--cold" in sys.argv
    times = [once(binary, cold) for _ in range(runs)]
    where = "from disk" if cold else "page cache warm"
    print(f"{binary}: median {statistics.median(times):.1f} ms over {runs} starts ({where})")


if __name__ == "__main__":
    main()
