// The machines loom plan predicts a run on: nodes of devices, each with its
// memory, its achieved dense GEMM FLOP/s per dtype (and the peak MFU is
// quoted against), its memory bandwidth, and two links — between devices of
// one node and between nodes — each an alpha-beta model (a message of n
// bytes takes latency + n / bandwidth; Hockney 1994).
//
// Written as TOML (every field below, [cluster] and its sub-tables):
//
//   [cluster]
//   name = "8 x H100 SXM"
//   nodes = 1
//   devices_per_node = 8
//   memory_gib = 80               # per device
//   memory_bandwidth_gbs = 3350   # per device, GB/s (1e9 bytes)
//   shared_cores = false          # true: a device is a CPU core the node's ranks share
//   [cluster.peak_tflops]         # the data sheet's dense figure per dtype
//   bf16 = 989
//   fp32 = 67
//   [cluster.achieved_tflops]     # what a large GEMM reaches (measured)
//   bf16 = 700
//   fp32 = 50
//   [cluster.intra_node]          # per device, one direction
//   bandwidth_gbs = 450
//   latency_us = 3
//   collective_bandwidth_gbs = 40 # optional, both or neither: one step of a
//   collective_latency_us = 20    # ring collective where it is not a message's
//   [cluster.inter_node]
//   bandwidth_gbs = 50
//   latency_us = 10
//
// The presets (cluster_preset) carry their sources beside the figures. A
// CPU machine is described by `loom plan --calibrate`, which measures it
// (plan/calibrate.h): there a "device" is a core, and ranks beyond the
// cores share them.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace loom::plan {

struct Link {
  double bandwidth = 0;  // bytes per second, one direction
  double latency = 0;    // seconds per message
  // A ring collective's step over this link where it was measured apart
  // (0: as a message): through MPI's collectives on a CPU a step also
  // reduces, copies through shared memory and waits for the slowest rank,
  // so it is slower than a send/recv of the same bytes.
  double collective_bandwidth = 0, collective_latency = 0;
  // Seconds one message of `bytes` takes.
  double seconds(double bytes) const { return latency + bytes / bandwidth; }
  // The link one step of a ring collective sees: the collective figures
  // where measured, else the message's.
  Link ring_step() const {
    if (collective_bandwidth <= 0) return {.bandwidth = bandwidth, .latency = latency};
    return {.bandwidth = collective_bandwidth, .latency = collective_latency};
  }
};

struct Cluster {
  std::string name;
  int nodes = 1, devices_per_node = 1;
  double memory_bytes = 0;            // per device
  double memory_bandwidth = 0;        // bytes per second per device
  std::map<std::string, double> peak_flops;      // per device, by dtype name (fp32, bf16, fp16)
  std::map<std::string, double> achieved_flops;  // per device: what loom's GEMM reaches
  Link intra, inter;
  // A device is a CPU core: the ranks on a node split its cores between
  // them (threads, or time-sharing past one rank per core), so a rank's
  // FLOP/s are achieved x devices_per_node / the node's ranks.
  bool shared_cores = false;
  std::string source;  // where the figures come from (a preset's citations, or "measured by loom plan --calibrate on ...")

  int devices() const { return nodes * devices_per_node; }
  // The figure for dtype (fp32, bf16, fp16); a dtype the cluster does not
  // list is a loom::Error naming the ones it does.
  double achieved(const std::string& dtype) const;
  double peak(const std::string& dtype) const;
};

// The presets' names: h100 (nodes of 8 x H100 SXM 80 GB, NVLink 4,
// 8 x 400 Gb/s InfiniBand NDR per node), a100 (nodes of 8 x A100 SXM
// 80 GB, NVLink 3, 8 x 200 Gb/s HDR per node).
std::vector<std::string> cluster_presets();
// A preset of `nodes` nodes; an unknown name is a loom::Error listing them.
Cluster cluster_preset(const std::string& name, int nodes = 1);

// A cluster TOML file (above); missing fields, values out of range and
// unknown keys are loom::Errors naming the file, the key and what is
// allowed.
Cluster load_cluster(const std::string& path);
// `spec`: a preset name or a TOML file's path.
Cluster cluster_from(const std::string& spec, int nodes = 1);
// The TOML text load_cluster reads back to the same cluster.
std::string cluster_toml(const Cluster& c);

}  // namespace loom::plan
