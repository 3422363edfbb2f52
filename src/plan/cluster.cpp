#include "plan/cluster.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include <toml++/toml.h>

#include "core/error.h"

namespace loom::plan {
namespace {

constexpr double kGB = 1e9, kGiB = 1024.0 * 1024.0 * 1024.0, kTera = 1e12, kMicro = 1e-6;
constexpr const char* kDtypes[] = {"fp32", "bf16", "fp16"};

std::string dtype_list(const std::map<std::string, double>& m) {
  std::string out;
  for (const auto& [name, value] : m) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

double figure(const std::map<std::string, double>& m, const std::string& dtype, const Cluster& c, const char* what) {
  const auto it = m.find(dtype);
  LOOM_REQUIRE(it != m.end(), "cluster '", c.name, "' has no ", what, " figure for ", dtype, ": it lists ",
               dtype_list(m));
  return it->second;
}

// A node of 8 GPUs: the data sheet's figures, an assumed GEMM efficiency
// and NCCL-like latencies (each said in `source`).
Cluster gpu_nodes(const std::string& name, double memory_gb, double bandwidth_tbs, double bf16_tflops,
                  double fp32_tflops, double nvlink_gbs, double ib_gbs, const std::string& source) {
  constexpr double kGemmEfficiency = 0.7;
  Cluster c;
  c.name = name, c.devices_per_node = 8, c.memory_bytes = memory_gb * kGB, c.memory_bandwidth = bandwidth_tbs * 1e12;
  c.peak_flops = {{"bf16", bf16_tflops * kTera}, {"fp16", bf16_tflops * kTera}, {"fp32", fp32_tflops * kTera}};
  for (const auto& [dtype, peak] : c.peak_flops) c.achieved_flops[dtype] = kGemmEfficiency * peak;
  c.intra = {.bandwidth = nvlink_gbs * kGB, .latency = 5 * kMicro};
  c.inter = {.bandwidth = ib_gbs * kGB, .latency = 10 * kMicro};
  c.source = source +
             "; achieved GEMM FLOP/s assumed 0.7 x peak (a large cuBLAS GEMM's usual efficiency, not measured by "
             "loom); link latencies assumed 5 us within a node, 10 us between nodes (NCCL's small-message order)";
  return c;
}

// The table at `key` of t, or a loom::Error naming it.
const toml::table& table_at(const toml::table& t, const std::string& key, const std::string& where) {
  const toml::table* sub = t[key].as_table();
  LOOM_REQUIRE(sub != nullptr, where, ": [", key, "] is missing: a cluster file has [cluster] with nodes, ",
               "devices_per_node, memory_gib, memory_bandwidth_gbs and the tables peak_tflops, achieved_tflops, ",
               "intra_node and inter_node");
  return *sub;
}

double positive(const toml::table& t, const std::string& key, const std::string& where) {
  const toml::node* n = t.get(key);
  LOOM_REQUIRE(n != nullptr, where, ": ", key, " is missing");
  std::optional<double> v = n->is_integer() || n->is_floating_point() ? n->value<double>() : std::nullopt;
  LOOM_REQUIRE(v && std::isfinite(*v) && *v > 0, where, ": ", key, " is invalid: allowed values are numbers > 0");
  return *v;
}

void require_keys(const toml::table& t, std::set<std::string> allowed, const std::string& where) {
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    if (allowed.contains(k)) continue;
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail(where, ": unknown key ", k, ": allowed keys are ", list);
  }
}

std::map<std::string, double> tflops(const toml::table& t, const std::string& key, const std::string& where) {
  const std::string at = concat(where, " [cluster.", key, "]");
  const toml::table& sub = table_at(t, key, where);
  require_keys(sub, {"fp32", "bf16", "fp16"}, at);
  std::map<std::string, double> out;
  for (const char* dtype : kDtypes)
    if (sub.contains(dtype)) out[dtype] = positive(sub, dtype, at) * kTera;
  LOOM_REQUIRE(out.contains("fp32"), at, ": fp32 is missing (every cluster computes in fp32)");
  return out;
}

Link link(const toml::table& t, const std::string& key, const std::string& where) {
  const std::string at = concat(where, " [cluster.", key, "]");
  const toml::table& sub = table_at(t, key, where);
  require_keys(sub, {"bandwidth_gbs", "latency_us", "collective_bandwidth_gbs", "collective_latency_us"}, at);
  const auto latency = [&](const char* key) {
    const toml::node* lat = sub.get(key);
    LOOM_REQUIRE(lat != nullptr && (lat->is_integer() || lat->is_floating_point()) && *lat->value<double>() >= 0, at,
                 ": ", key, " is missing or invalid: allowed values are numbers >= 0");
    return *lat->value<double>() * kMicro;
  };
  Link l{.bandwidth = positive(sub, "bandwidth_gbs", at) * kGB, .latency = latency("latency_us")};
  const bool cb = sub.contains("collective_bandwidth_gbs"), cl = sub.contains("collective_latency_us");
  LOOM_REQUIRE(cb == cl, at, ": ", cb ? "collective_latency_us" : "collective_bandwidth_gbs",
               " is missing: give collective_bandwidth_gbs and collective_latency_us together, or neither");
  if (cb)
    l.collective_bandwidth = positive(sub, "collective_bandwidth_gbs", at) * kGB,
    l.collective_latency = latency("collective_latency_us");
  return l;
}

}  // namespace

double Cluster::achieved(const std::string& dtype) const { return figure(achieved_flops, dtype, *this, "achieved"); }
double Cluster::peak(const std::string& dtype) const { return figure(peak_flops, dtype, *this, "peak"); }

std::vector<std::string> cluster_presets() { return {"h100", "a100"}; }

Cluster cluster_preset(const std::string& name, int nodes) {
  LOOM_REQUIRE(nodes >= 1, "cluster preset ", name, ": nodes = ", nodes, " is invalid: allowed values are >= 1");
  Cluster c;
  if (name == "h100") {
    c = gpu_nodes("H100 SXM 80 GB nodes (8 GPUs, NVLink 4, 8 x 400 Gb/s NDR)", 80, 3.35, 989.4, 66.9, 450, 50,
                  "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989.4 dense BF16 TFLOP/s, 66.9 FP32, 3.35 TB/s "
                  "HBM3, NVLink 900 GB/s both directions); DGX H100: one 400 Gb/s ConnectX-7 per GPU");
  } else if (name == "a100") {
    c = gpu_nodes("A100 SXM 80 GB nodes (8 GPUs, NVLink 3, 8 x 200 Gb/s HDR)", 80, 2.039, 312, 19.5, 300, 25,
                  "NVIDIA A100 Tensor Core GPU datasheet (SXM 80 GB: 312 dense BF16 TFLOP/s, 19.5 FP32, 2,039 GB/s "
                  "HBM2e, NVLink 600 GB/s both directions); DGX A100: one 200 Gb/s HDR adapter per GPU");
  } else {
    std::string list;
    for (const std::string& p : cluster_presets()) list += (list.empty() ? "" : ", ") + p;
    fail("unknown cluster preset '", name, "': presets are ", list, ", or give a cluster TOML file (loom plan ",
         "--calibrate writes one for this machine)");
  }
  c.nodes = nodes;
  return c;
}

Cluster load_cluster(const std::string& path) {
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    fail(path, ": not a valid TOML file: ", e.description(), " (line ", e.source().begin.line, ")");
  }
  require_keys(doc, {"cluster"}, path);
  const toml::table& t = table_at(doc, "cluster", path);
  const std::string where = concat(path, " [cluster]");
  require_keys(t,
               {"name", "source", "nodes", "devices_per_node", "memory_gib", "memory_bandwidth_gbs", "shared_cores",
                "peak_tflops", "achieved_tflops", "intra_node", "inter_node"},
               where);
  Cluster c;
  c.name = t["name"].value_or(std::string(path));
  c.source = t["source"].value_or(std::string("the cluster file ") + path);
  for (auto [key, out] : {std::pair{"nodes", &c.nodes}, std::pair{"devices_per_node", &c.devices_per_node}}) {
    const std::optional<int64_t> v = t[key].value<int64_t>();
    LOOM_REQUIRE(v && *v >= 1 && *v <= 1'000'000, where, ": ", key,
                 " is missing or invalid: allowed values are integers >= 1 and <= 1000000");
    *out = static_cast<int>(*v);
  }
  c.memory_bytes = positive(t, "memory_gib", where) * kGiB;
  c.memory_bandwidth = positive(t, "memory_bandwidth_gbs", where) * kGB;
  if (const toml::node* n = t.get("shared_cores")) {
    LOOM_REQUIRE(n->is_boolean(), where, ": shared_cores is invalid: allowed values are true, false");
    c.shared_cores = *n->value<bool>();
  }
  c.peak_flops = tflops(t, "peak_tflops", where);
  c.achieved_flops = tflops(t, "achieved_tflops", where);
  c.intra = link(t, "intra_node", where);
  c.inter = link(t, "inter_node", where);
  return c;
}

Cluster cluster_from(const std::string& spec, int nodes) {
  for (const std::string& p : cluster_presets())
    if (spec == p) return cluster_preset(spec, nodes < 1 ? 1 : nodes);
  if (!std::filesystem::exists(spec)) {
    std::string list;
    for (const std::string& p : cluster_presets()) list += (list.empty() ? "" : ", ") + p;
    fail("--cluster ", spec, ": no such preset or file: presets are ", list, ", or give a cluster TOML file (loom ",
         "plan --calibrate writes one for this machine)");
  }
  Cluster c = load_cluster(spec);
  if (nodes >= 1) c.nodes = nodes;
  return c;
}

std::string cluster_toml(const Cluster& c) {
  const auto num = [](double v) {
    char s[40];
    std::snprintf(s, sizeof s, "%.6g", v);
    return std::string(s);
  };
  const auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) out += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
    return out + "\"";
  };
  std::string out = concat("[cluster]\nname = ", quoted(c.name), "\nsource = ", quoted(c.source), "\nnodes = ", c.nodes,
                           "\ndevices_per_node = ", c.devices_per_node, "\nmemory_gib = ", num(c.memory_bytes / kGiB),
                           "\nmemory_bandwidth_gbs = ", num(c.memory_bandwidth / kGB),
                           "\nshared_cores = ", c.shared_cores ? "true" : "false", "\n");
  for (auto [table, m] : {std::pair{"peak_tflops", &c.peak_flops}, std::pair{"achieved_tflops", &c.achieved_flops}}) {
    out += concat("\n[cluster.", table, "]\n");
    for (const auto& [dtype, v] : *m) out += concat(dtype, " = ", num(v / kTera), "\n");
  }
  for (auto [table, l] : {std::pair{"intra_node", &c.intra}, std::pair{"inter_node", &c.inter}}) {
    out += concat("\n[cluster.", table, "]\nbandwidth_gbs = ", num(l->bandwidth / kGB), "\nlatency_us = ",
                  num(l->latency / kMicro), "\n");
    if (l->collective_bandwidth > 0)
      out += concat("collective_bandwidth_gbs = ", num(l->collective_bandwidth / kGB), "\ncollective_latency_us = ",
                    num(l->collective_latency / kMicro), "\n");
  }
  return out;
}

}  // namespace loom::plan
