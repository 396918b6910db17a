"""dev/cuda/sass_md5.py, the per-kernel SASS identity check between builds, on synthetic nvdisasm
text: a kernel whose labels nvdisasm numbered differently (a change in an earlier kernel shifts
the cubin-wide label counter) must hash the same; a changed instruction or branch target must
not."""
from script_loader import load_script


def load():
    return load_script("dev/cuda/sass_md5.py", siblings=True)  # it imports sass_loops


def kernel(name, label, body="IADD3 R2, R2, 0x1, RZ", target=None):
    """One kernel as `nvdisasm -g` prints it: a loop from label back to itself, then EXIT."""
    target = target or label
    return (f"\t.text.{name}:\n"
            f"        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
            f"{label}:\n"
            f"        /*0010*/                   {body} ;\n"
            f"        /*0020*/              @P0 BRA `({target}) ;\n"
            f"{'.L_x_99' if target != label else '.L_x_98'}:\n"
            f"        /*0030*/                   EXIT ;\n")


def test_label_numbering_does_not_count():
    m = load()
    a = m.sass_hashes(kernel("kA", ".L_x_1") + kernel("kB", ".L_x_3"))
    b = m.sass_hashes(kernel("kA", ".L_x_1") + kernel("kB", ".L_x_7"))
    assert set(a) == {"kA", "kB"}
    assert a == b


def test_changed_instruction_or_target_counts():
    m = load()
    base = m.sass_hashes(kernel("kA", ".L_x_1") + kernel("kB", ".L_x_3"))
    body = m.sass_hashes(kernel("kA", ".L_x_1") + kernel("kB", ".L_x_3", body="IADD3 R2, R2, 0x2, RZ"))
    assert body["kA"] == base["kA"] and body["kB"] != base["kB"]
    # the branch now goes to the label after it (address 0x30), not back to 0x10
    jump = m.sass_hashes(kernel("kA", ".L_x_1") + kernel("kB", ".L_x_3", target=".L_x_99"))
    assert jump["kB"] != base["kB"]


def test_helper_numbering_and_comment_padding_do_not_count():
    m = load()
    call = "CALL.REL.NOINC `($__internal_{}_$__cuda_sm20_div_s64)"
    spill = "STL [R1+0x28], RZ{}(*\"SpillRefill\"*)"
    a = m.sass_hashes(kernel("kA", ".L_x_1", body=call.format(25)) +
                      kernel("kB", ".L_x_3", body=spill.format(" " * 20)))
    b = m.sass_hashes(kernel("kA", ".L_x_1", body=call.format(19)) +
                      kernel("kB", ".L_x_3", body=spill.format(" " * 21)))
    assert a == b
    other = m.sass_hashes(kernel("kA", ".L_x_1", body=call.format(25).replace("div", "rem")) +
                          kernel("kB", ".L_x_3", body=spill.format(" " * 20)))
    assert other["kA"] != a["kA"]  # a different helper still counts


def test_register_names_count_unless_regs():
    m = load()
    base = m.sass_hashes(kernel("kA", ".L_x_1"))
    renamed = kernel("kA", ".L_x_1", body="IADD3 R7, R7, 0x1, RZ")
    assert m.sass_hashes(renamed)["kA"] != base["kA"]
    assert m.sass_hashes(renamed, regs=True)["kA"] == m.sass_hashes(kernel("kA", ".L_x_1"), regs=True)["kA"]
    # an immediate or another opcode still counts with regs
    other = kernel("kA", ".L_x_1", body="IADD3 R7, R7, 0x2, RZ")
    assert m.sass_hashes(other, regs=True)["kA"] != m.sass_hashes(renamed, regs=True)["kA"]


def test_changed_counts_the_differing_instructions():
    m = load()
    a = ["MOV R1", "IADD3 R2", "FADD R3", "EXIT"]
    assert m.changed(a, a) == 0
    assert m.changed(a, ["MOV R1", "IADD3 R9", "FADD R3", "EXIT"]) == 1
    assert m.changed(a, ["MOV R1", "FADD R3", "IADD3 R2", "EXIT"]) == 2  # one moved: out and in
    assert m.changed(a, a + ["NOP", "NOP"]) == 2
