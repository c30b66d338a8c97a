/* The embedded real sample: layer 1 of model "tiny" (scripts/make_sample.py). */
  .section .rodata
  .balign 16
  .global twell_sample_begin
  .global twell_sample_end
twell_sample_begin:
  .incbin TWELL_SAMPLE_PATH
twell_sample_end:
  .section .note.GNU-stack,"",@progbits
