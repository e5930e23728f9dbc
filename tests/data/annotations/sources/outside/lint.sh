#!/bin/sh
echo $HOME/*
