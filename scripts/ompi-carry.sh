#!/usr/bin/env bash
# Copies this machine's Open MPI launcher and runtime (Debian 12's 4.1 with its
# PMIx) into DIR/ompi, for running loom under mpirun on a machine that has no
# MPI (the lent GPU machine: scripts/gpu-carry.sh calls this). The files keep
# their Debian paths under DIR/ompi; DIR/ompi/env.sh, sourced there, points
# PATH, LD_LIBRARY_PATH and Open MPI's and PMIx's install directories at them.
# Libraries they load that the other machine may lack go to DIR/ompi/lib;
# the network transports that need hardware libraries (UCX, verbs, libfabric,
# PSM) stay behind: env.sh selects shared memory (btl self,vader; pml ob1).
#   bash scripts/ompi-carry.sh DIR
set -euo pipefail
dir=${1:?usage: ompi-carry.sh DIR}
command -v orterun >/dev/null || { echo "ompi-carry.sh: no Open MPI here (orterun)" >&2; exit 1; }
arch=x86_64-linux-gnu
o=$dir/ompi
rm -rf "$o"
mkdir -p "$o/lib"
for f in /usr/bin/orterun /usr/bin/orted /usr/lib/$arch/openmpi /usr/lib/$arch/pmix2 /usr/share/openmpi /etc/openmpi; do
  mkdir -p "$o$(dirname "$f")"
  cp -a "$f" "$o$(dirname "$f")/"
done
ln -s orterun "$o/usr/bin/mpirun"
rm -rf "$o/usr/lib/$arch/openmpi/include"
# What they load, but the C library's, the hardware transports' and their plugins'.
for f in "$o/usr/bin/orterun" "$o/usr/bin/orted" "$o"/usr/lib/$arch/openmpi/lib/openmpi3/*.so \
         "$o"/usr/lib/$arch/pmix2/lib/pmix/*.so "$o"/usr/lib/$arch/pmix2/lib/libpmix.so.2; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    libuc[mpst].so*|libibverbs*|librdmacm*|libfabric*|libefa*|libpsm*|libinfinipath*|libnl-*|liboshmem*) ;;
    *) cp -L "$lib" "$o/lib/" ;;
  esac
done
cat >"$o/env.sh" <<'ENV'
# Open MPI carried by scripts/ompi-carry.sh: its launcher and runtime from here.
o=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
a=x86_64-linux-gnu
export PATH="$o/usr/bin:$PATH"
export LD_LIBRARY_PATH="$o/lib:$o/usr/lib/$a/openmpi/lib:$o/usr/lib/$a/pmix2/lib:${LD_LIBRARY_PATH:-}"
export OPAL_PREFIX="$o/usr" OPAL_EXEC_PREFIX="$o/usr" OPAL_BINDIR="$o/usr/bin" OPAL_LIBDIR="$o/usr/lib/$a/openmpi/lib"
export OPAL_PKGLIBDIR="$o/usr/lib/$a/openmpi/lib/openmpi3" OPAL_DATAROOTDIR="$o/usr/share" OPAL_DATADIR="$o/usr/share"
export OPAL_PKGDATADIR="$o/usr/share/openmpi" OPAL_SYSCONFDIR="$o/etc/openmpi"
export OMPI_MCA_mca_base_component_path="$OPAL_PKGLIBDIR" OMPI_MCA_mca_base_component_show_load_errors=0
export PMIX_INSTALL_PREFIX="$o/usr/lib/$a/pmix2" PMIX_MCA_mca_base_component_path="$o/usr/lib/$a/pmix2/lib/pmix"
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_plm=isolated  # one host: no ssh to start daemons elsewhere
unset o a
ENV
du -sh "$o"
