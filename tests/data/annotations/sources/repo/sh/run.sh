#!/bin/sh
files=$(ls *.txt)
for f in $files; do
  echo $f
done
if [ $1 = "x" ] then
  echo yes
fi
