"""Repack the vLLM wheel without the compiled parts that a dense bf16 model on Hopper never loads.

    python3 repack.py vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl OUT.whl

The PyPI wheel is about 290 MiB; the device machine takes at most 64 MiB per call,
so what vLLM only imports for other hardware or other model families is left out
(each import below is guarded, so vLLM still imports without it). Every other
member is copied in the source order with its timestamp and attributes, deflated
at level 9, and RECORD is rewritten for the members kept: the output is
byte-for-byte the same on every run with the same zlib.
"""

import base64
import csv
import hashlib
import io
import os
import sys
import zipfile

DROP_FILES = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # FlashAttention 2: Hopper uses FA3; its import is try/except
    "vllm/_moe_C_stable_libtorch.abi3.so",  # MoE ops only; its import is suppress(ImportError)
    "vllm/vllm-rs",  # Rust API frontend, used only with VLLM_USE_RUST_FRONTEND
    "vllm/_flashmla_C.abi3.so",  # MLA attention only; its import is try/except
    "vllm/_flashmla_extension_C.abi3.so",  # MLA attention only; its import is try/except
}
# DeepGEMM (fp8 / DeepSeek kernels) and the SM100 (Blackwell) FMHA kernels for MiniMax-M3.
DROP_DIRS = ("vllm/third_party/deep_gemm/", "vllm/third_party/fmha_sm100/")


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(src, dst):
    zin = zipfile.ZipFile(src)
    names = zin.namelist()
    record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
    dropped = [n for n in names if n in DROP_FILES or n.startswith(DROP_DIRS)]
    missing = DROP_FILES - set(names)
    if missing:
        sys.exit(f"expected files not in wheel: {sorted(missing)}")
    keep = [n for n in names if n not in dropped and n != record_name]
    records = []
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for n in keep:
            info = zin.getinfo(n)
            data = zin.read(n)
            zi = zipfile.ZipInfo(n, date_time=info.date_time)
            zi.external_attr = info.external_attr
            zi.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(zi, data, compresslevel=9)
            records.append([n, record_hash(data), str(len(data))])
        records.append([record_name, "", ""])
        rinfo = zin.getinfo(record_name)
        zi = zipfile.ZipInfo(record_name, date_time=rinfo.date_time)
        zi.external_attr = rinfo.external_attr
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(records)
        zout.writestr(zi, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    unpacked = sum(zin.getinfo(n).file_size for n in dropped) / 2**20
    packed = sum(zin.getinfo(n).compress_size for n in dropped) / 2**20
    zin.close()
    print(f"dropped {len(dropped)} files ({unpacked:.1f} MiB unpacked, {packed:.1f} MiB packed)")
    print(f"{os.path.getsize(src) / 2**20:.1f} MiB -> {os.path.getsize(dst) / 2**20:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: repack.py SRC.whl DST.whl")
    repack(sys.argv[1], sys.argv[2])
