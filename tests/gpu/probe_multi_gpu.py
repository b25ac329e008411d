#!/usr/bin/env python3
"""probe_multi_gpu.py - ceilings of a multi-GPU device machine, measured
with PyTorch (which carries NCCL): peer-to-peer copy bandwidth GPU0->GPU1,
and NCCL all-reduce latency per call at the message sizes tensor
parallelism sends (one process per GPU, torch.distributed, NVLS off).
Prints where libnccl.so.2 lives (baton dlopens it).  Run on the device:
    python3 tests/gpu/probe_multi_gpu.py
"""
import os, sys, time
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def nccl_path():
    try:
        import nvidia.nccl
        base = list(nvidia.nccl.__path__)[0]
        for root, _, files in os.walk(base):
            if "libnccl.so.2" in files:
                return os.path.join(root, "libnccl.so.2")
    except Exception as e:
        return "not found (%s)" % e
    return "not found"

def p2p():
    n = torch.cuda.device_count()
    print("gpus", n, "p2p 0<->1", torch.cuda.can_device_access_peer(0, 1) if n > 1 else None)
    if n < 2:
        return
    for mb in (16, 256, 1024):
        a = torch.empty(mb << 20, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(mb << 20, dtype=torch.uint8, device="cuda:1")
        for _ in range(3):
            b.copy_(a)
        torch.cuda.synchronize(0); torch.cuda.synchronize(1)
        reps = 20
        t = time.perf_counter()
        for _ in range(reps):
            b.copy_(a, non_blocking=True)
        torch.cuda.synchronize(0); torch.cuda.synchronize(1)
        dt = (time.perf_counter() - t) / reps
        print("p2p copy %5d MiB: %.1f GB/s" % (mb, (mb << 20) / dt / 1e9))

def ar_worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    for elems in (4096, 4096 * 8, 4096 * 64, 4096 * 512, 4096 * 2048):
        for dt in (torch.float32, torch.bfloat16):
            x = torch.ones(elems, dtype=dt, device="cuda")
            for _ in range(20):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            reps = 200
            # CUDA graph of many all-reduces: the per-call device latency
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                dist.all_reduce(x)
                torch.cuda.synchronize()
                with torch.cuda.graph(g, stream=s):
                    for _ in range(50):
                        dist.all_reduce(x)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps // 50):
                g.replay()
            torch.cuda.synchronize()
            dt_s = (time.perf_counter() - t) / reps
            if rank == 0:
                print("allreduce %-8s %9d elems (%7.1f KiB): %6.1f us/call (graph)"
                      % (str(dt).split(".")[-1], elems,
                         elems * x.element_size() / 1024, dt_s * 1e6))
    dist.destroy_process_group()

if __name__ == "__main__":
    print("libnccl:", nccl_path())
    print("torch nccl version", torch.cuda.nccl.version())
    p2p()
    n = torch.cuda.device_count()
    if n >= 2:
        mp.spawn(ar_worker, args=(n,), nprocs=n, join=True)
