"""check-guarded-io.py flags what it must (a tree with one of each violation)
and passes the repository's own agent/ sources."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "check-guarded-io.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)


class CheckGuardedIoTest(unittest.TestCase):
    def test_the_repository_passes(self):
        r = run(os.path.join(HERE, ".."))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_each_way_around_the_guard_is_flagged(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "agent", "x"))
            os.makedirs(os.path.join(root, "agent", "guard"))
            bad = [
                'int fd = open(path.c_str(), O_RDONLY);',
                'UniqueFd fd(::open(p, O_RDONLY));',
                'std::ifstream in(fmt::format("/proc/{}/maps", pid));',
                'FILE* f = fopen(p, "r");',
                'void* m = mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);',
                'Elf* e = elf_begin(fd, ELF_C_READ_MMAP, nullptr);',
                'Elf_Data* d = elf_getdata(scn, nullptr);',
                'const char* n = elf_strptr(elf, ndx, off);',
                'Dwarf* dw = dwarf_begin(fd, DWARF_C_READ);',
            ]
            with open(os.path.join(root, "agent", "x", "reader.cc"), "w") as f:
                f.write("\n".join(bad) + "\n")
            allowed = [
                'UniqueFd fd(::open(path.c_str(), O_RDONLY));  // guarded-io: the agent\'s state dir',
                '// open(path) in a comment is not code',
                'auto file = guard::OpenHostFile(path);',
                'cs_open(CS_ARCH_X86, CS_MODE_64, &cs_);',
            ]
            with open(os.path.join(root, "agent", "x", "fine.cc"), "w") as f:
                f.write("\n".join(allowed) + "\n")
            with open(os.path.join(root, "agent", "guard", "opener.cc"), "w") as f:
                f.write("int fd = open(p, O_PATH);\n")
            with open(os.path.join(root, "agent", "x", "reader_test.cc"), "w") as f:
                f.write("int fd = open(p, O_RDONLY);\n")
            r = run(root)
            self.assertEqual(r.returncode, 1, r.stdout)
            flagged = [line for line in r.stdout.splitlines() if line.startswith("agent/")]
            self.assertEqual(len(flagged), len(bad), r.stdout)
            self.assertTrue(all(line.startswith("agent/x/reader.cc:") for line in flagged), r.stdout)


if __name__ == "__main__":
    unittest.main()
