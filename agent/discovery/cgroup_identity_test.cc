#include "agent/discovery/cgroup_identity.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "agent/discovery/process_registry.h"

namespace tlsprof::discovery {
namespace {

// Ids in the shape the runtimes write them (docker ps --no-trunc, the pod's
// metadata.uid).
const std::string kId = "3f1c6a9e2b7d4c8f90a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6b";
const std::string kInner = "9b2e7c41d0a35f68e1c2b3a4958677f0e1d2c3b4a5968778695a4b3c2d1e0f9a";
const std::string kPod = "8d4c0d6e-3f1a-4b2c-9d8e-7f6a5b4c3d2e";
const std::string kPodUnderscored = "8d4c0d6e_3f1a_4b2c_9d8e_7f6a5b4c3d2e";
const std::string kInnerPod = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const std::string kInnerPodUnderscored = "0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d";

struct Sample {
  const char* what;
  std::string path;
  ContainerIdentity want;
};

void ExpectAll(const std::vector<Sample>& samples) {
  for (const Sample& s : samples) {
    const ContainerIdentity got = IdentityFromCgroupPath(s.path);
    EXPECT_EQ(got.container_id, s.want.container_id) << s.what << ": " << s.path;
    EXPECT_EQ(got.pod_uid, s.want.pod_uid) << s.what << ": " << s.path;
    EXPECT_EQ(got.runtime, s.want.runtime) << s.what << ": " << s.path;
  }
}

TEST(CgroupIdentity, Docker) {
  ExpectAll({
      {"cgroupfs driver (v1 and v2)", "/docker/" + kId, {kId, "", "docker"}},
      {"systemd driver", "/system.slice/docker-" + kId + ".scope", {kId, "", "docker"}},
      {"--cgroup-parent under a custom slice", "/custom.slice/docker-" + kId + ".scope", {kId, "", "docker"}},
      {"nerdctl (containerd, systemd driver)", "/system.slice/nerdctl-" + kId + ".scope", {kId, "", "containerd"}},
  });
}

TEST(CgroupIdentity, KubernetesSystemdDriver) {
  const std::string besteffort =
      "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kPodUnderscored + ".slice/";
  ExpectAll({
      {"containerd", besteffort + "cri-containerd-" + kId + ".scope", {kId, kPod, "containerd"}},
      {"containerd, burstable",
       "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kPodUnderscored + ".slice/cri-containerd-" +
           kId + ".scope",
       {kId, kPod, "containerd"}},
      {"containerd, guaranteed",
       "/kubepods.slice/kubepods-pod" + kPodUnderscored + ".slice/cri-containerd-" + kId + ".scope",
       {kId, kPod, "containerd"}},
      {"CRI-O", besteffort + "crio-" + kId + ".scope", {kId, kPod, "cri-o"}},
      // crun puts the payload one level down when the container has its own cgroup namespace.
      {"CRI-O + crun", besteffort + "crio-" + kId + ".scope/container", {kId, kPod, "cri-o"}},
      {"CRI-O's conmon: not the container, nor the pod's", besteffort + "crio-conmon-" + kId + ".scope", {}},
      {"dockershim", besteffort + "docker-" + kId + ".scope", {kId, kPod, "docker"}},
      {"the pod's slice itself", besteffort, {"", kPod, ""}},
  });
}

TEST(CgroupIdentity, KubernetesCgroupfsDriver) {
  ExpectAll({
      {"besteffort", "/kubepods/besteffort/pod" + kPod + "/" + kId, {kId, kPod, "cri"}},
      {"burstable", "/kubepods/burstable/pod" + kPod + "/" + kId, {kId, kPod, "cri"}},
      {"guaranteed", "/kubepods/pod" + kPod + "/" + kId, {kId, kPod, "cri"}},
      {"CRI-O", "/kubepods/besteffort/pod" + kPod + "/crio-" + kId, {kId, kPod, "cri-o"}},
      {"the pod's directory itself", "/kubepods/burstable/pod" + kPod, {"", kPod, ""}},
  });
}

TEST(CgroupIdentity, Podman) {
  ExpectAll({
      {"rootful, systemd driver", "/machine.slice/libpod-" + kId + ".scope", {kId, "", "podman"}},
      {"rootful, payload in its own cgroup", "/machine.slice/libpod-" + kId + ".scope/container", {kId, "", "podman"}},
      {"rootless",
       "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + kId + ".scope/container",
       {kId, "", "podman"}},
      {"cgroupfs driver", "/libpod_parent/libpod-" + kId, {kId, "", "podman"}},
      {"conmon", "/machine.slice/libpod-conmon-" + kId + ".scope", {}},
  });
}

TEST(CgroupIdentity, NestedTheInnermostContainerWins) {
  ExpectAll({
      {"docker-in-docker", "/docker/" + kId + "/docker/" + kInner, {kInner, "", "docker"}},
      {"kind: a pod in a node container",
       "/system.slice/docker-" + kId +
           ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
           "kubelet-kubepods-besteffort-pod" +
           kPodUnderscored + ".slice/cri-containerd-" + kInner + ".scope",
       {kInner, kPod, "containerd"}},
      {"k3s in docker (cgroupfs driver)",
       "/docker/" + kId + "/kubepods/besteffort/pod" + kPod + "/" + kInner,
       {kInner, kPod, "cri"}},
      {"kind: the node's own processes (kubelet)",
       "/system.slice/docker-" + kId + ".scope/kubelet.slice",
       {kId, "", "docker"}},
      // The node container is not the pod's: a process in the pod's slice gets the pod alone.
      {"kind: the pod's slice in a node",
       "/system.slice/docker-" + kId + ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" +
           kPodUnderscored + ".slice",
       {"", kPod, ""}},
      {"a pod in a pod's container (kind in Kubernetes)",
       "/kubepods/burstable/pod" + kPod + "/" + kId + "/kubepods/besteffort/pod" + kInnerPod + "/" + kInner,
       {kInner, kInnerPod, "cri"}},
      {"conmon in a kind node: the node container's",
       "/system.slice/docker-" + kId +
           ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
           "kubelet-kubepods-besteffort-pod" +
           kInnerPodUnderscored + ".slice/crio-conmon-" + kInner + ".scope",
       {kId, "", "docker"}},
  });
}

TEST(CgroupIdentity, HostProcessesHaveNone) {
  ExpectAll({
      {"root", "/", {}},
      {"empty", "", {}},
      {"init", "/init.scope", {}},
      {"a service", "/system.slice/nginx.service", {}},
      {"dockerd itself", "/system.slice/docker.service", {}},
      {"containerd itself", "/system.slice/containerd.service", {}},
      {"a login session", "/user.slice/user-1000.slice/session-3.scope", {}},
      {"a desktop app", "/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4242.scope", {}},
      {"the kubelet's QoS slice", "/kubepods.slice/kubepods-besteffort.slice", {}},
      // A test harness's 32-hex cgroup (this machine's memory hierarchy).
      {"a 32-hex job cgroup", "/process_api/f58fa9fe79b3b288e6b635176655e110", {}},
  });
}

TEST(CgroupIdentity, LookalikesAreRejected) {
  std::string upper = kId;
  upper[0] = 'F';
  std::string short_id = kId.substr(1);
  ExpectAll({
      {"upper-case hex", "/docker/" + upper, {}},
      {"63 hex digits", "/system.slice/docker-" + short_id + ".scope", {}},
      {"65 hex digits", "/system.slice/docker-" + kId + "0.scope", {}},
      {"an id under an unknown parent", "/system.slice/" + kId, {}},
      {"a docker- service, not a scope", "/system.slice/docker-" + kId + ".service", {}},
      {"a pod directory outside kubepods", "/pod" + kPod + "/" + kId, {}},
      {"a dashed UID in a slice name", "/kubepods.slice/kubepods-pod" + kPod + ".slice", {}},
      {"an underscored UID in a directory", "/kubepods/pod" + kPodUnderscored, {}},
      {"a UID with a separator out of place", "/kubepods/pod8d4c0d6e3-f1a-4b2c-9d8e-7f6a5b4c3d2e/" + kId, {}},
  });
}

// Seen from an agent in a private cgroup namespace (docs/fleet.md): names
// with their runtime's prefix still match; bare cgroupfs directories whose
// parent lies above the namespace root do not.
TEST(CgroupIdentity, NamespaceRelativePaths) {
  ExpectAll({
      {"systemd driver",
       "/../../kubepods-besteffort-pod" + kPodUnderscored + ".slice/crio-" + kId + ".scope",
       {kId, kPod, "cri-o"}},
      {"docker scope", "/../docker-" + kId + ".scope", {kId, "", "docker"}},
      {"cgroupfs docker, parent above the root", "/../" + kId, {}},
      {"cgroupfs pod, parent above the root", "/../pod" + kPod + "/" + kId, {}},
      {"cgroupfs pod, its QoS directory visible", "/../../besteffort/pod" + kPod + "/" + kId, {kId, kPod, "cri"}},
  });
}

TEST(CgroupIdentity, ShortIdIsDockersTwelveDigits) {
  const ContainerIdentity id = IdentityFromCgroupPath("/docker/" + kId);
  EXPECT_EQ(id.ShortId(), "3f1c6a9e2b7d");
  EXPECT_EQ(ContainerIdentity{}.ShortId(), "");
}

TEST(CgroupIdentityFile, HybridHostV1LinesNameTheContainer) {
  // Docker with the cgroupfs driver on a hybrid host: only the v1 hierarchies
  // show the container; the unified one holds dockerd's scope.
  const std::string file = "12:cpu,cpuacct:/docker/" + kId + "\n4:memory:/docker/" + kId + "\n1:name=systemd:/docker/" +
                           kId + "\n0::/system.slice/containerd.service\n";
  const ContainerIdentity id = IdentityFromCgroupFile(file);
  EXPECT_EQ(id.container_id, kId);
  EXPECT_EQ(id.runtime, "docker");
  EXPECT_EQ(CgroupV2Path(file), "/system.slice/containerd.service");
}

TEST(CgroupIdentityFile, ThePodNamingLineAndThenTheV2LineWin) {
  const std::string v1_container_only = "3:cpuset:/docker/" + kInner + "\n";
  const std::string v2_pod = "0::/kubepods/besteffort/pod" + kPod + "/" + kId + "\n";
  for (const std::string& file : {v1_container_only + v2_pod, v2_pod + v1_container_only}) {
    const ContainerIdentity id = IdentityFromCgroupFile(file);
    EXPECT_EQ(id.container_id, kId) << file;
    EXPECT_EQ(id.pod_uid, kPod) << file;
  }
  const std::string v1 = "1:name=systemd:/system.slice/docker-" + kInner + ".scope\n";
  const std::string v2 = "0::/system.slice/docker-" + kId + ".scope";  // no trailing newline
  EXPECT_EQ(IdentityFromCgroupFile(v1 + v2).container_id, kId);
  EXPECT_EQ(IdentityFromCgroupFile(v2 + "\n" + v1).container_id, kId);
}

TEST(CgroupIdentityFile, HostAndMalformedFilesGiveNothing) {
  // This machine's own file: v1 controllers, a harness's memory cgroup, a cgroup2 mount.
  EXPECT_TRUE(IdentityFromCgroupFile("9:name=systemd:/\n4:memory:/process_api/f58fa9fe79b3b288e6b635176655e110\n"
                                     "1:cpu:/\n0::/\n")
                  .empty());
  EXPECT_TRUE(IdentityFromCgroupFile("").empty());
  EXPECT_TRUE(IdentityFromCgroupFile("garbage\nno colons here /docker/" + kId + "\n").empty());
  EXPECT_EQ(CgroupV2Path("1:cpu:/\n"), "");
  EXPECT_EQ(CgroupV2Path("0::/a:b/c"), "/a:b/c");
}

TEST(CgroupIdentityFile, ReadFromAProcRoot) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("tlsprof-cgroup-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "42");
  const std::string file = "1:name=systemd:/\n0::/kubepods/burstable/pod" + kPod + "/" + kId + "\n";
  std::ofstream(root / "42" / "cgroup") << file;
  EXPECT_EQ(ReadCgroupFile(42, root.string()), file);
  EXPECT_EQ(IdentityFromCgroupFile(ReadCgroupFile(42, root.string())).container_id, kId);
  EXPECT_EQ(ReadCgroupFile(43, root.string()), "");  // gone
  // The default root is the real /proc.
  EXPECT_FALSE(ReadCgroupFile(getpid()).empty());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace tlsprof::discovery
