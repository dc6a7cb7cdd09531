# Environment for data-parallel clla jobs (docs/DISTRIBUTED.md). Source it before mpirun or
# in a batch script; every value can be overridden by setting it first.
#
# Network interfaces: name the ones between the nodes (ip -br addr). Without it OpenMPI and
# NCCL may pick a docker bridge or a management NIC, and jobs hang at the first collective.
export CLLA_IFACE=${CLLA_IFACE:-eth0}
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-$CLLA_IFACE}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-$CLLA_IFACE}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$CLLA_IFACE}
# InfiniBand / RoCE: CLLA_IB=1 uses it (NCCL's IB transport, GPUDirect RDMA up to the PCIe
# host bridge); CLLA_IB=0 forces TCP sockets (clusters without IB, or to rule it out).
export CLLA_IB=${CLLA_IB:-1}
if [ "$CLLA_IB" = 1 ]; then
    export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-0}
    export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
else
    export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
    export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}   # no openib/ucx probing
    export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
fi
# NCCL_DEBUG=INFO prints the rings/trees and the transport it chose: the first thing to look at
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# One OpenMP thread per core of a rank's share of the node (CPU backend); set per job.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# A checkpoint on SIGTERM: signal the clla ranks themselves (pkill -TERM -f 'clla train' on each
# node; a scheduler that signals the job's tasks does), not mpirun: OpenMPI 4.1's mpirun passes a
# SIGTERM on only after about twice odls_base_sigkill_timeout and kills the ranks right after
# (docs/DISTRIBUTED.md, "Failures"), so raising that timeout only delays the stop.
