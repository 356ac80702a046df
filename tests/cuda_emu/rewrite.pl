#!/usr/bin/perl
# tests/cuda_emu/rewrite.pl IN OUT: a CUDA source (kernels/cuda/*.cu, *.cuh)
# as C++ for the CUDA emulator: every launch `k<<<grid, block, smem,
# stream>>>(args)` becomes
#   mmp_emu::launch("k", mmp_emu::config(grid, block, smem, stream),
#                   [&](auto... mmp_a) { k(mmp_a...); })(args)
# (tests/cuda_emu/include/mmp_cuda_emu.h). A `<<<` or `>>>` it cannot
# rewrite is an error, never a file left half done. A #line keeps the
# compiler's messages on the real file.
use strict;
use warnings;

die "usage: rewrite.pl IN OUT\n" unless @ARGV == 2;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "rewrite.pl: $in: $!\n";
my $src = do { local $/; <$fh> };
close($fh);
$src =~ s{\b([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>}
         {mmp_emu::launch("$1", mmp_emu::config($2), [&](auto... mmp_a) { $1(mmp_a...); })}gs;
$src =~ s{(__shared__\s[^;{}]*?\b(\w+)\s*(?:\[[^\]]+\]\s*)+;)}
         {$1 mmp_emu::shared_poison($2, sizeof $2);}g;
if ($src =~ /(<<<|>>>)/) {
    my $line = 1 + (() = substr($src, 0, $-[0]) =~ /\n/g);
    die "rewrite.pl: $in:$line: a kernel launch this script cannot rewrite ('$1')\n";
}
open(my $o, '>', "$out.part") or die "rewrite.pl: $out.part: $!\n";
print $o "#line 1 \"$in\"\n", $src or die "rewrite.pl: $out.part: $!\n";
close($o) or die "rewrite.pl: $out.part: $!\n";
rename("$out.part", $out) or die "rewrite.pl: $out: $!\n";
