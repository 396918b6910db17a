"""dev/cuda/sass_loops.py's --shape view of a hot loop, on synthetic nvdisasm text: mnemonics in
order with runs counted, waits and barriers with their first modifier, predicates dropped."""
from script_loader import load_script

LOOP = """\t.text.kA:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING R21, 0x100 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   MUFU.EX2 R3, R3 ;
        /*0060*/               @!P0 MUFU.EX2 R4, R4 ;
        /*0070*/                   FADD.FTZ R5, R3, R4 ;
        /*0080*/               @P1 BRA `(.L_x_1) ;
        /*0090*/                   EXIT ;
"""


def test_loop_shape():
    m = load_script("dev/cuda/sass_loops.py")
    kernels = m.parse(LOOP)
    instrs, labels = kernels["kA"]
    assert m.hot_loops(instrs, labels) == [(0x10, 0x80)]
    assert m.loop_shape(instrs, 0x10, 0x80) == (
        "BAR.SYNC HGMMAx2 WARPGROUP.DEPBAR MUFUx2 FADD BRA")
