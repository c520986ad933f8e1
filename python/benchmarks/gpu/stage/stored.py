"""Rewrite every wheel of a folder with ZIP_STORED members, so that xz can compress the bundle.

    python3 stored.py SRC_DIR DST_DIR

Deflated members look random to xz; stored ones let it find the redundancy across
files and wheels. The members, their order, timestamps, attributes and RECORD stay
the same (pip installs a stored wheel like the original), but the wheel files'
own bytes and SHA-256 change: reassemble.sh checks these stored wheels
(WHEELS.SHA256), stage.sh checks the originals (wheels.sha256).
"""

import os
import sys
import zipfile


def store(src, dst):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zi = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            zi.external_attr = info.external_attr
            zi.compress_type = zipfile.ZIP_STORED
            zout.writestr(zi, zin.read(info.filename))


def main(src_dir, dst_dir):
    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        if not name.endswith(".whl"):
            continue
        src, dst = os.path.join(src_dir, name), os.path.join(dst_dir, name)
        store(src, dst)
        print(f"{name}: {os.path.getsize(src) / 2**20:.1f} -> {os.path.getsize(dst) / 2**20:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: stored.py SRC_DIR DST_DIR")
    main(sys.argv[1], sys.argv[2])
